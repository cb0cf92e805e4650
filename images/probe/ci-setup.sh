#!/bin/sh
# What the probe's built-in `pi` recipe needs (durable_spaces/probe/recipes/pi/): Node and
# npm (from Debian when missing), and the Pi coding agent from npm, installed into a
# project-local prefix, never globally:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/durable-spaces/probe/npm   (node_modules/.bin/pi)
# which is where durable_spaces/probe/recipes/pi/pi.sh looks first. The Python harnesses
# come from PyPI: pip install -e '.[probe]'. Idempotent: a second run installs nothing.
# Prints what it did. PI_VERSION overrides the version (the one docs/probe-recipes.md
# was measured with by default).
set -eu
PI_PACKAGE=@mariozechner/pi-coding-agent
PI_VERSION=${PI_VERSION:-0.73.1}
PREFIX="${XDG_CACHE_HOME:-$HOME/.cache}/durable-spaces/probe/npm"
PI_BIN="$PREFIX/node_modules/.bin/pi"
say() { echo "ci-setup(probe): $*"; }

if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  say "node $(node --version) and npm $(npm --version) present"
else
  say "installing Debian's nodejs and npm"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  say "node $(node --version) and npm $(npm --version) installed"
fi
# Pi declares engines node >= 20.6; an older Node installs it but may not run it (the
# recipe's `available` check runs it and says so).
if ! node -e 'const [a,b]=process.versions.node.split(".").map(Number);process.exit(a>20||(a==20&&b>=6)?0:1)'; then
  say "warning: node $(node --version) is older than Pi's 20.6" >&2
fi

installed=""
if [ -x "$PI_BIN" ]; then
  installed=$(npm ls --prefix "$PREFIX" --depth=0 --json 2>/dev/null |
    node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{try{const j=JSON.parse(s);process.stdout.write(((j.dependencies||{})[process.argv[1]]||{}).version||"")}catch(e){}})' "$PI_PACKAGE")
fi
if [ "$installed" = "$PI_VERSION" ]; then
  say "$PI_PACKAGE $PI_VERSION present in $PREFIX"
else
  say "installing $PI_PACKAGE@$PI_VERSION into $PREFIX${installed:+ (was $installed)}"
  mkdir -p "$PREFIX"
  npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error \
    "$PI_PACKAGE@$PI_VERSION" >/dev/null
fi
"$PI_BIN" --version >/dev/null 2>&1 ||
  { say "$PI_BIN does not run (node $(node --version))" >&2; exit 1; }
say "pi $("$PI_BIN" --version 2>&1 | tail -n 1) at $PI_BIN"
