#!/usr/bin/env bash
# Installs the built fp8ref into a scratch prefix and builds tests/consumer against it with find_package.
set -euo pipefail
build=$1; src=$(cd "$(dirname "$0")" && pwd); work=$build/consumer-check
rm -rf "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" -j2 >/dev/null
"$work/build/consumer"
