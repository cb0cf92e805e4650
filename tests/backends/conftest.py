"""Tests of what each backend promises beyond the shared contract (that is
``tests/conformance``, one suite every backend runs).

Layout: one flat file per backend package, named after it (``test_local.py`` for
``durable_spaces/backends/local/``, and so on), plus the checks that span all of them
(``test_protocols.py``: the registry's backends satisfy the protocols they claim;
``test_layering.py``: the backends' imports go one way, with no circles). Flat on
purpose: each backend's promises read as one story in one file (its layout, its faults,
its crash windows), none of those files is near the size that would call for a folder,
and subfolders would need ``__init__`` files (or clash on names like ``test_space.py``)
for no gain. A package's module that grows promises of its own gets a file of its own
here, named ``test_<package>_<module>.py``.
"""
