"""microvm Spaces (``python -m bench.microvm``): what a whole-machine Space costs.

Figures, each printed with the accelerator it ran under (TCG is several times slower
than KVM, so a figure without it means little):

- fork of the image's booted base checkpoint to the daemon's first answer (``create``),
  and to a Space ready for use (token rotated, clock set);
- cold boot of the same disk to the first answer (``restart``);
- checkpoint: the guest's pause, the memory file and the frozen disk layer, per call
  (plain, and with the memory zstd-compressed);
- restore of a checkpoint to the first answer and to ready;
- a trivial keyed exec (``exec true``, the daemon's part of a wrapped bash call) on
  microvm against the same call on ``local`` (ratio);
- a whole wrapped ``bash`` and ``write`` call through the adapter in checkpoint mode
  (machine checkpoints on microvm, workspace tars on local), with the unwrapped operation
  beside it and the ratio to local.

One guest at a time (the machines this runs on have two shared cores). About a minute.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import statistics
import tempfile
import time
import uuid

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("CUA_TELEMETRY", "0")

from durable_spaces.backends import open_backend, unavailable_reason

FORKS = 3
CHECKPOINTS = 5
CALLS = 30
ADAPTER_REPS = 6


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def _line(what: str, value: str, accel: str, note: str = "") -> None:
    print(f"microvm  {what:44s} {value:>14s}   [{accel}]  {note}", flush=True)


async def _calls(space: object, tag: str) -> float:
    xs = []
    for i in range(CALLS):
        t0 = time.perf_counter()
        r = await space.exec(["true"], key=f"{tag}:{i}:0@1", epoch=1)  # type: ignore[attr-defined]
        xs.append(time.perf_counter() - t0)
        assert r.exit_code == 0
    return _med(xs)


async def main() -> None:
    reason = unavailable_reason("microvm")
    if reason is not None:
        print(f"microvm  skipped: {reason}")
        return
    from durable_spaces.backends.microvm.backend import MicrovmBackend

    with tempfile.TemporaryDirectory(prefix="ds-bench-microvm-") as tmp:
        # Plain memory files first (compression is measured on its own below), and no
        # retention: the restores below reach back to older checkpoints.
        b = MicrovmBackend(pathlib.Path(tmp) / "microvm", keep_checkpoints=0, compress=False)
        acc = b.accel.name
        print(f"# accelerator: {acc} ({b.accel.reason}); guest {b.memory_mb} MiB, 1 vCPU")

        first, ready = [], []
        for i in range(FORKS):
            t0 = time.perf_counter()
            sp = await b.create(f"fork-{i}")
            r = await sp.exec(["true"], key=None, epoch=0)
            assert r.exit_code == 0
            ready.append(time.perf_counter() - t0)
            first.append(b.last["restore"])
            await b.delete(f"fork-{i}")
        _line("fork of base checkpoint -> first answer", f"{_med(first):.2f} s", acc)
        _line("fork of base checkpoint -> ready + exec", f"{_med(ready):.2f} s", acc)

        name = "bench"
        sp = await b.create(name)
        t0 = time.perf_counter()
        await b.restart(name)
        boot_total = time.perf_counter() - t0
        _line("cold boot -> first answer", f"{b.last['boot']:.2f} s", acc)
        _line("restart (sync, kill, cold boot)", f"{boot_total:.2f} s", acc)

        found = await b.find(name)
        assert found is not None, f"Space {name} is gone after its restart"
        sp = found
        pauses: list[float] = []
        sizes: list[float] = []
        calls: list[float] = []
        layers: list[float] = []
        ids = []
        for i in range(CHECKPOINTS):
            await sp.write_file(f"f{i}", os.urandom(64 * 1024), epoch=1)
            t0 = time.perf_counter()
            cid = await b.checkpoint(name)
            calls.append(time.perf_counter() - t0)
            ids.append(cid)
            pauses.append(b.last["checkpoint_pause"])
            sizes.append(b.last["checkpoint_bytes"])
            frozen = b.checkpoint_meta(cid).chain[-1]
            layers.append(float(pathlib.Path(frozen).stat().st_size))
        _line("checkpoint: guest pause", f"{_med(pauses) * 1000:.0f} ms", acc)
        _line("checkpoint: whole call", f"{_med(calls) * 1000:.0f} ms", acc)
        _line("checkpoint: memory file", f"{_med(sizes) / 1e6:.0f} MB", acc)
        _line("checkpoint: frozen disk layer", f"{_med(layers) / 1e6:.2f} MB", acc)

        zp, zs, zids = [], [], []
        b.compress = True
        for i in range(3):
            await sp.write_file(f"z{i}", os.urandom(64 * 1024), epoch=1)
            zids.append(await b.checkpoint(name))
            zp.append(b.last["checkpoint_pause"])
            zs.append(b.last["checkpoint_bytes"])
        b.compress = False
        _line("checkpoint (zstd): guest pause", f"{_med(zp) * 1000:.0f} ms", acc)
        _line("checkpoint (zstd): memory file", f"{_med(zs) / 1e6:.0f} MB", acc)

        rfirst, rready = [], []
        for cid in ids[-3:]:
            t0 = time.perf_counter()
            sp = await b.restore(name, cid)
            r = await sp.exec(["true"], key=None, epoch=0)
            assert r.exit_code == 0
            rready.append(time.perf_counter() - t0)
            rfirst.append(b.last["restore"])
        _line("restore -> first answer", f"{_med(rfirst):.2f} s", acc)
        _line("restore -> ready + exec", f"{_med(rready):.2f} s", acc)
        sp = await b.restore(name, zids[-1])
        _line("restore (zstd) -> first answer", f"{b.last['restore']:.2f} s", acc)
        assert (await sp.read_file("z2")) is not None

        vm_call = await _calls(sp, f"b{uuid.uuid4().hex[:6]}")
        await b.delete(name)
        await b.prune(set())
        await b.close()

        local = open_backend("local", pathlib.Path(tmp) / "local")
        lsp = await local.create("bench")
        loc_call = await _calls(lsp, f"l{uuid.uuid4().hex[:6]}")
        await local.delete("bench")
        await local.close()
        _line(
            "keyed exec (exec true)",
            f"{vm_call * 1000:.1f} ms",
            acc,
            f"local {loc_call * 1000:.1f} ms, ratio {vm_call / loc_call:.1f}x",
        )
        await _adapter_calls(pathlib.Path(tmp), acc)


async def _adapter_calls(tmp: pathlib.Path, acc: str) -> None:
    """A whole wrapped call through the adapter, checkpoint mode (what auto picks on
    microvm): start mark, the effect, outcome commit, the machine checkpoint, the boot-id
    check, the checkpoint commit. On local it is an incremental workspace checkpoint."""
    from bench.adapter import bench_mode
    from bench.peers import tree_tar

    med: dict[tuple[str, str], tuple[float, float]] = {}
    for name in ("microvm", "local"):
        backend = open_backend(name, tmp / f"adapter-{name}" / "spaces")
        work = tmp / f"adapter-{name}" / "run"
        work.mkdir(parents=True)
        try:
            figs = await bench_mode(
                name, backend, work, "checkpoint", 10, tree_tar(10), ("bash", "write"), ADAPTER_REPS
            )
            for fig in figs:
                med[name, fig.tool] = (_med(fig.wrapped), _med(fig.plain))
        finally:
            for sp_name in await backend.names():
                await backend.delete(sp_name)
            if hasattr(backend, "prune"):
                await backend.prune(set())
            await backend.close()
    for tool in ("bash", "write"):
        vm, vm_plain = med["microvm", tool]
        loc, _ = med["local", tool]
        _line(
            f"wrapped {tool}, checkpoint mode (adapter)",
            f"{vm * 1000:.0f} ms",
            acc,
            f"unwrapped {vm_plain * 1000:.0f} ms; local wrapped {loc * 1000:.0f} ms, "
            f"ratio {vm / loc:.1f}x",
        )


if __name__ == "__main__":
    asyncio.run(main())
