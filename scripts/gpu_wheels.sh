#!/usr/bin/env bash
# Download the pure-Python wheels of scripts/gpu_wheels.txt into .gpu_wheels/ (ignored by git), for
# python 3.12 on any platform, without their dependencies (the list names each one it needs). Run it on
# a machine with a package index, then carry .gpu_wheels to the GPU machine with the working tree;
# scripts/gpu_check.sh installs from it whatever does not import there.
#
#     bash scripts/gpu_wheels.sh [DIR]        # default DIR: .gpu_wheels
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.gpu_wheels}"
mkdir -p "$dir"
mapfile -t reqs < <(grep -v '^\s*\(#\|$\)' scripts/gpu_wheels.txt | awk '{print $2}')
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
  --abi none --platform any --dest "$dir" "${reqs[@]}"
# a wheel that is not pure Python would not install on the GPU machine's interpreter
if ls "$dir"/*.whl | grep -v -- '-py3-none-any\.whl$' | grep -v -- '-py2\.py3-none-any\.whl$'; then
  echo "the wheels above are not pure-Python (py3-none-any)" >&2; exit 1
fi
count=$(ls "$dir"/*.whl | wc -l)
kib=$(du -sk "$dir" | cut -f1)
echo "$count wheels, $((kib / 1024)).$(((kib % 1024) * 10 / 1024)) MiB in $dir"
if (( kib > 32 * 1024 )); then
  echo "more than 32 MiB: what travels with the working tree is 64 MiB in all" >&2; exit 1
fi
