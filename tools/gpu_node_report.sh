#!/usr/bin/env bash
# Run a part of the gpu report on an offline GPU node whose python3 has torch and triton, from a
# checkout that carries wheelhouse/ (make wheelhouse). Packs reports/gpu into one archive at the end,
# also when the time limit cut the run short.
#   tools/gpu_node_report.sh NOTEBOOKS SECONDS ARCHIVE
set -u
notebooks=$1; seconds=$2; archive=$3
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/lib
python3 -m pip install -q --no-index --find-links wheelhouse papermill nbconvert nbformat ipykernel 2>&1 | grep -v WARNING | tail -3
nvidia-smi -L
timeout "$seconds" python3 -m cs336_systems.report.run --profile gpu --notebooks "$notebooks" --cell-timeout 400
echo "report exit: $?"
tar czf "$archive" reports/gpu
ls -la "$archive"
