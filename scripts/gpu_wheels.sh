#!/usr/bin/env bash
# Download the pure-Python wheels of scripts/gpu_wheels.txt into .gpu_wheels/ (ignored by git), for
# python 3.12 on any platform, without their dependencies (the list names each one it needs), and put
# the default config's tiny base model in .gpu_wheels/cache/base/ (the one in the local cache, or
# pretrained now: minutes of CPU). Run it on a machine with a package index, then carry .gpu_wheels to
# the GPU machine with the working tree; scripts/gpu_check.sh installs from it whatever does not import
# there and takes the base model from it instead of pretraining one.
#
#     bash scripts/gpu_wheels.sh [DIR]        # default DIR: .gpu_wheels; python: $PYTHON (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
dir="${1:-.gpu_wheels}"
mkdir -p "$dir"
mapfile -t reqs < <(grep -v '^\s*\(#\|$\)' scripts/gpu_wheels.txt | awk '{print $2}')
"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
  --abi none --platform any --dest "$dir" "${reqs[@]}"
# a wheel that is not pure Python would not install on the GPU machine's interpreter
if ls "$dir"/*.whl | grep -v -- '-py3-none-any\.whl$' | grep -v -- '-py2\.py3-none-any\.whl$'; then
  echo "the wheels above are not pure-Python (py3-none-any)" >&2; exit 1
fi
# the tiny base model of the default config, as `mathrl base` resolves it (cached, or pretrained now)
base=$(PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$py" -m mathrl.cli base)
mkdir -p "$dir/cache/base"
rm -rf "$dir/cache/base/$(basename "$base")"
cp -r "$base" "$dir/cache/base/"
count=$(ls "$dir"/*.whl | wc -l)
kib=$(du -sk "$dir" | cut -f1)
echo "$count wheels and the base model $(basename "$base"), $((kib / 1024)).$(((kib % 1024) * 10 / 1024)) MiB in $dir"
if (( kib > 32 * 1024 )); then
  echo "more than 32 MiB: what travels with the working tree is 64 MiB in all" >&2; exit 1
fi
