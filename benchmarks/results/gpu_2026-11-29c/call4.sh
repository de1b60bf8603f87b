set -u
cd .snap; export PYTHONPATH=.:dbg PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 100 python3 -m pytest -x -v -s -p no:cacheprovider --tb=short tests/gpu/test_gpu_expert_parallel.py -k "1-deepseek" > $OUT/ep.log 2>&1
echo "rc=$?" >> $OUT/ep.log
grep -v "%|" $OUT/ep.log | grep -v "^\s*$" | grep -v "site-packages/_pytest\|pluggy" | tail -n 120
