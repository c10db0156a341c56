set -u
mkdir -p /etc/OpenCL/vendors; echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PYOPENCL_CTX=NVIDIA
python3 setup.py -q build_ext --inplace 2>&1 | grep -iv "warn\|beta" | tail -3
start=$(date +%s)
timeout 300 python3 -m pytest -q -n 8 -p no:benchmark -p no:randomly 2>&1 | tail -4
echo "tests took $(( $(date +%s) - start )) s"
timeout 200 python3 benchmarks/pools.py --write 2>&1 | grep -v "^\[pools\]" | tail -28
timeout 200 python3 benchmarks/ops.py --write 2>&1 | grep -v "^\[ops\]" | tail -30
timeout 100 python3 benchmarks/interop.py --write 2>&1 | grep -v "^\[interop\]" | head -8
cp benchmarks/RESULTS.md $OUT/RESULTS_c.md
for i in 2 3; do timeout 90 python3 benchmarks/pools.py 2>&1 | grep "svmkit Pool\|cupy.empty |\|torch.empty(device=\"cuda\") |\|PyOpenCL array"; done
