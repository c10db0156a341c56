set -u
export PYTHONPATH=/tmp/site:$PWD PYOPENCL_CTX=NVIDIA
python3 -c "import svmkit.resources._cpool" || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; python3 setup.py -q build_ext --inplace 2>&1 | tail -1; }
start=$(date +%s)
timeout 280 python3 benchmarks/ops.py --write 2>&1 | grep -v "^\[ops\]" | tail -45
echo "ops took $(( $(date +%s) - start )) s"
start=$(date +%s)
timeout 150 python3 benchmarks/interop.py --write 2>&1 | grep -v "^\[interop\]" | tail -30
echo "interop took $(( $(date +%s) - start )) s"
cp benchmarks/RESULTS.md $OUT/RESULTS_b.md
for i in 2 3; do timeout 60 python3 benchmarks/pools.py --quick 2>&1 | grep "svmkit Pool\|cupy.empty |\|torch.empty(device=\"cuda\") |\|PyOpenCL array"; done
