tar -xzf target/gpu-pack/pack.tar.gz -C target || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH=$PWD/target/cuda-bin:$PATH REPRO_BIN=$PWD/target/cuda-bin/repro REPRO_CUDA_HASH_LIB=$PWD/target/cuda-bin/librepro_cuda_hash.so
export PYTHONPATH=python:$PYTHONPATH PYTHONUNBUFFERED=1
R=$PWD/target/cuda-bin/repro
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, torchvision, transformers; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), "torchvision", torchvision.__version__, "transformers", transformers.__version__)'
echo "== gpu-check"; timeout 240 $R gpu-check 2>&1 | tail -40
echo "== gpt width 512, 4 layers, context 256, batch 16: two same-seed runs, every step's values kept"
for r in 1 2; do /usr/bin/time -f "%e s" timeout 150 $R record --workload gpt --device cuda:0 --width 512 --layers 4 --context 256 --batch 16 --steps 4 --capture all --out /tmp/g$r 2>&1 | tail -2; done
$R diff /tmp/g1 /tmp/g2 2>&1 | head -3
$R inspect /tmp/g1 --verify 2>&1 | tail -2
echo "== resnet18 batch 256, hashes only, twice"
for r in 1 2; do /usr/bin/time -f "%e s" timeout 150 $R record --workload resnet18 --device cuda:0 --batch 256 --steps 3 --capture none --out /tmp/r$r 2>&1 | tail -2; done
$R diff /tmp/r1 /tmp/r2 2>&1 | head -3
echo "== resnet18 batch 256, every value, verified"
timeout 150 $R record --workload resnet18 --device cuda:0 --batch 256 --steps 2 --capture all --out /tmp/r3 2>&1 | tail -1
$R inspect /tmp/r3 --verify 2>&1 | tail -2
echo "== the PyTorch GPU test"
timeout 100 python3 -m unittest python/tests/test_torch.py -k gpu 2>&1 | tail -3
echo "== every flush policy records the same hashes"
timeout 150 python3 python/bench/torch_flush_check.py /tmp/fc resnet50 densenet121 efficientnet_b0 2>&1 | grep -v Warning
echo "== pairs"
timeout 240 python3 python/bench/torch_cost.py --header --steps 6 --pairs 8 --variants plain,batched resnet50 densenet121 efficientnet_b0 mobilenet_v3_large 2>&1 | grep -v Warning
} 2>&1 | tee $OUT/log.txt
