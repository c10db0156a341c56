set -u
mkdir -p /etc/OpenCL/vendors; echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PYOPENCL_CTX=NVIDIA
python3 setup.py -q build_ext --inplace 2>&1 | grep -iv "warn\|beta" | tail -3
python3 -c "import svmkit.resources._cpool as c, svmkit; print('cpool ok', svmkit.__version__)"
start=$(date +%s)
timeout 330 python3 -m pytest -q -n 8 -p no:benchmark -p no:randomly 2>&1 | tail -6
echo "tests took $(( $(date +%s) - start )) s"
start=$(date +%s)
timeout 200 python3 benchmarks/pools.py --write 2>&1 | grep -v "^\[pools\]" | tail -30
echo "pools took $(( $(date +%s) - start )) s"
cp benchmarks/RESULTS.md $OUT/RESULTS_a.md
