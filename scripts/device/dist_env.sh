# Sourced by the multi-GPU device scripts (ddp.sh, shard.sh, scaling.sh, x4.sh): the environment their
# steps run in. PY may be set by the caller (e.g. PY=.venv/bin/python for a CPU dry run).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# NVLink multicast stays off (shared machine; KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PY:-python3}
CLI="-m cs336_systems"
