set -u
export PYTHONPATH=/tmp/site:$PWD PYOPENCL_CTX=NVIDIA
python3 -c "import svmkit.resources._cpool" 2>/dev/null || { mkdir -p /etc/OpenCL/vendors; echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; python3 setup.py -q build_ext --inplace 2>&1 | tail -1; }
timeout 150 python3 benchmarks/pools.py --write 2>&1 | grep -v "^\[pools\]" | tail -28
cp benchmarks/RESULTS.md $OUT/RESULTS_d.md
for i in 2 3; do timeout 150 python3 benchmarks/pools.py 2>&1 | grep "svmkit Pool\|cupy.empty |\|torch.empty(device=\"cuda\") |\|PyOpenCL array\|0.8x"; done
