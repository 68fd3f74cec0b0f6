tar -xzf target/gpu-pack/pack.tar.gz -C target || exit 1
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=$PWD/target/cuda-bin/repro
{
for r in 1 2; do timeout 150 $R record --workload gpt --device cuda:0 --width 512 --layers 4 --context 256 --batch 16 --steps 4 --capture all --out /tmp/g$r 2>&1 | tail -1; done
$R diff /tmp/g1 /tmp/g2 2>&1 | grep -E "^(IDENTICAL|DIVERGED|INCOMPLETE|error)"; echo "diff exit ${PIPESTATUS[0]}"
$R inspect /tmp/g1 --verify > /tmp/v.txt 2>&1; echo "verify exit $?"; grep -i "verif" /tmp/v.txt | tail -3
for r in 1 2; do timeout 150 $R record --workload resnet18 --device cuda:0 --batch 256 --steps 3 --capture none --out /tmp/r$r 2>&1 | tail -1; done
$R diff /tmp/r1 /tmp/r2 2>&1 | grep -E "^(IDENTICAL|DIVERGED|INCOMPLETE|error)"; echo "diff exit ${PIPESTATUS[0]}"
timeout 150 $R record --workload resnet18 --device cuda:0 --batch 256 --steps 2 --capture all --out /tmp/r3 2>&1 | tail -1
$R inspect /tmp/r3 --verify > /tmp/v.txt 2>&1; echo "verify exit $?"; grep -i "verif" /tmp/v.txt | tail -3
} 2>&1 | tee $OUT/log.txt
