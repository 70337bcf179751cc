#!/usr/bin/env bash
# Run parts of the gpu report on an offline GPU node whose python3 has torch and triton, from a
# checkout that carries wheelhouse/ (make wheelhouse). Notebooks run one by one in the order given
# until SECONDS have passed; reports/gpu is packed into ARCHIVE at the end, also after a cut-off.
#   tools/gpu_node_report.sh "09 11 10" SECONDS ARCHIVE
set -u
usage='usage: tools/gpu_node_report.sh "NN NN ..." SECONDS ARCHIVE (e.g. tools/gpu_node_report.sh "09 11 10" 3000 gpu.tgz)'
[ $# -eq 3 ] || { echo "$usage" >&2; exit 2; }
[[ $2 =~ ^[0-9]+$ ]] || { printf '%s\n' "SECONDS must be a whole number of seconds, got '$2'" "$usage" >&2; exit 2; }
notebooks=$1; seconds=$2; archive=$3
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/lib NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
python3 -m pip install -q --no-index --find-links wheelhouse papermill nbconvert nbformat ipykernel transformers 2>&1 | grep -v WARNING | tail -3
deadline=$(( $(date +%s) + seconds ))
for nb in $notebooks; do
  left=$(( deadline - $(date +%s) ))
  [ "$left" -lt 20 ] && { echo "[gpu] no time left for $nb"; continue; }
  timeout "$left" python3 -m cs336_systems.report.run --profile gpu --notebooks "$nb" --cell-timeout 400 --no-html
done
python3 -m cs336_systems.report.run --profile gpu --out reports/gpu --index-only >/dev/null 2>&1
for f in reports/gpu/*.ipynb; do python3 -c "import sys; from cs336_systems.report.run import to_html; to_html(__import__('pathlib').Path(sys.argv[1]))" "$f"; done
tar czf "$archive" reports/gpu
ls -la "$archive"
