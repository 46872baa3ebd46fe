#!/bin/bash
# One GPU session's held-out check, as a device machine runs it (bench/README.md, "On a GPU machine").
#   bash bench/gpu_session.sh [validate_holdout.py arguments, e.g. --pairs 2 --only h3_vit_fp32.py]
# Installs the wheels of .whl/ (perfdoctor's dependencies the machine's image lacks) into /tmp/site,
# runs validate_holdout.py with --json $OUT/holdout.json --keep /tmp/keep, and packs the run
# directories into $OUT/rundirs.tgz (they re-diagnose here: bench/record_holdout.py). VALIDATE_S
# (default 420) bounds the check, so the packing runs even when it is cut short.
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/perfdoctor-gpu-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
    export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi -L 2>/dev/null
python3 -c "import perfdoctor.rules.engine, msgspec, simpleeval, typer, rich, psutil; print('perfdoctor imports: ok')" || exit 9
command -v py-spy >/dev/null || echo "note: no py-spy: run --stacks records no stacks"
T0=$(date +%s)
timeout "${VALIDATE_S:-420}" python3 bench/validate_holdout.py --json "$OUT/holdout.json" --keep /tmp/keep "$@" 2>&1 | tee "$OUT/holdout.log"
echo "validate_holdout took $(( $(date +%s) - T0 )) s"
[ -d /tmp/keep ] && tar czf "$OUT/rundirs.tgz" -C /tmp/keep .
ls -la "$OUT"
