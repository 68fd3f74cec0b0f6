//! The tensor-core product's kernels as their launchers know them: for kernels/matmul_bf16.cu
//! (any GPU from compute capability 8.0) the tile, and each kernel's name and shared memory; for
//! kernels/matmul_bf16_hopper.cu (9.0) each kernel's name, tile, threads and shared memory. The
//! numbers repeat the `.cu` files'; tests read the `.cu` files and check them, on any machine.

/// Tiles of the tensor-core kernels: 128 x 128 outputs a block of 256 threads.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) const TC_TILE: usize = 128;

/// The tensor-core kernels: name, and shared memory (3 slices in flight x both operands' 128
/// rows x (slice depth + 8 padding) x 2 bytes, the `.cu`'s `TC_SHARED`). The first is the one
/// products use; the other tiles K otherwise, and must give the same bits (gpu-check).
pub const TENSOR_CORE_VARIANTS: [(&str, usize); 2] =
    [("matmul_bf16_fixed", 3 * 256 * 72 * 2), ("matmul_bf16_fixed_k32", 3 * 256 * 40 * 2)];

/// Depth of the K slices the Hopper kernels read (`HOPPER_BK` in the `.cu`): 64 bf16, one
/// 128-byte swizzled row of the TMA unit's boxes.
pub(crate) const HOPPER_SLICE: usize = 64;

/// One of the Hopper product's kernels (kernels/matmul_bf16_hopper.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HopperKernel {
    /// The kernel's name in the `.cu`.
    pub name: &'static str,
    /// Output rows of a tile: 64 per consumer warpgroup.
    pub rows: usize,
    /// Output columns of a tile (the wgmma instruction's width).
    pub cols: usize,
    /// Threads of a block: 128 per consumer warpgroup, and the producer's 128.
    pub threads: usize,
    /// Blocks an SM runs at once (the `.cu`'s launch bounds).
    pub blocks_per_sm: usize,
    /// K slices of 64 whose multiplies a consumer keeps in flight.
    pub depth: usize,
    /// Dynamic shared memory: slots x (rows + cols) x 128 bytes (a K slice of 64 bf16 of each
    /// operand's tile), and 1024 bytes to start the first slot 1024-byte aligned.
    pub shared_bytes: usize,
}

impl HopperKernel {
    const fn of(
        name: &'static str,
        cols: usize,
        consumers: usize,
        slots: usize,
        depth: usize,
        blocks_per_sm: usize,
    ) -> HopperKernel {
        let rows = 64 * consumers;
        HopperKernel {
            name,
            rows,
            cols,
            threads: 128 * (consumers + 1),
            blocks_per_sm,
            depth,
            shared_bytes: slots * (rows + cols) * HOPPER_SLICE * 2 + 1024,
        }
    }

    /// Tiles of a product of `batch` x `m` x `n` outputs.
    pub fn tiles(&self, batch: usize, m: usize, n: usize) -> usize {
        m.div_ceil(self.rows) * n.div_ceil(self.cols) * batch
    }
}

/// The Hopper kernels, largest tiles first. All give the same bits (gpu-check), so which one a
/// product takes (`choose_hopper_kernel`) never shows in its result.
pub const HOPPER_VARIANTS: [HopperKernel; 4] = [
    HopperKernel::of("matmul_bf16_hopper_wide", 256, 2, 4, 1, 1),
    HopperKernel::of("matmul_bf16_hopper_medium", 128, 2, 4, 1, 1),
    HopperKernel::of("matmul_bf16_hopper_small", 64, 1, 6, 2, 2),
    HopperKernel::of("matmul_bf16_hopper_narrow", 32, 1, 8, 4, 2),
];

/// The kernel a product of `batch` x `m` x `n` outputs takes on a GPU of `sms` SMs: the one whose
/// waves of tiles over the SMs take the least time by the model below, and of equal times the
/// largest tiles.
///
/// A tile's time is K / 16 dependent wgmma steps (no split of K shortens it), and a step of a
/// tile of rows x cols, with `blocks_per_sm` blocks sharing an SM's tensor cores (2048 bf16
/// multiply-adds a cycle), takes about 88 + 1.25 x rows x cols x blocks / 128 cycles: fitted to
/// each kernel's rate on an H200 at 4096^3 (`repro gpu-check --only tensor-core`'s second
/// table, docs/results/tensor-core-hopper-h200.md), where a step's work shows; on few rows its
/// latency does.
pub fn choose_hopper_kernel(sms: usize, batch: usize, m: usize, n: usize) -> &'static HopperKernel {
    let time = |k: &HopperKernel| {
        let step = 88 + 5 * (k.rows * k.cols * k.blocks_per_sm / 128) / 4;
        k.tiles(batch, m, n).div_ceil(sms * k.blocks_per_sm) * step
    };
    HOPPER_VARIANTS.iter().min_by_key(|k| time(k)).expect("kernels")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = include_str!("../../kernels/matmul_bf16.cu");
    const HOPPER_SOURCE: &str = include_str!("../../kernels/matmul_bf16_hopper.cu");

    /// Each kernel of the Hopper `.cu`: `__launch_bounds__(THREADS, BLOCKS) NAME(...) {
    /// hopper_matmul<COLS, CONSUMERS, SLOTS, DEPTH>(...); }`, as the launcher must know it.
    #[test]
    fn the_hopper_launcher_knows_each_kernel_as_the_cu_defines_it() {
        let between = |text: &str, from: &str, to: &str| -> String {
            let (_, rest) = text.split_once(from).unwrap_or_else(|| panic!("no {from} in {text}"));
            rest.split_once(to).unwrap().0.trim().to_string()
        };
        let numbers = |list: String| -> Vec<usize> { list.split(',').map(|a| a.trim().parse().unwrap()).collect() };
        let kernels: Vec<HopperKernel> = HOPPER_SOURCE
            .split("extern \"C\" __global__")
            .skip(1)
            .map(|kernel| {
                let name = between(kernel, ")", "(");
                let known = HOPPER_VARIANTS.iter().find(|k| k.name == name).unwrap_or_else(|| panic!("{name} unknown"));
                let [threads, blocks] = numbers(between(kernel, "__launch_bounds__(", ")"))[..] else {
                    panic!("{kernel}")
                };
                let [cols, consumers, slots, depth] = numbers(between(kernel, "hopper_matmul<", ">"))[..] else {
                    panic!("{kernel}")
                };
                assert_eq!(known.threads, threads, "{name}'s threads");
                HopperKernel::of(known.name, cols, consumers, slots, depth, blocks)
            })
            .collect();
        assert_eq!(kernels, HOPPER_VARIANTS);
        let slice = HOPPER_SOURCE.lines().find(|l| l.starts_with("#define HOPPER_BK ")).unwrap();
        assert_eq!(slice.split_whitespace().nth(2).unwrap().parse::<usize>().unwrap(), HOPPER_SLICE);
        // The blocks an SM runs fit its 228 KiB of shared memory (227 KiB a block at most, the
        // barriers' few bytes besides); a consumer never keeps more slices in flight than the
        // slots hold; the largest tiles come first.
        for k in HOPPER_VARIANTS {
            assert!(k.shared_bytes <= 227 * 1024 && k.blocks_per_sm * (k.shared_bytes + 1024) <= 228 * 1024, "{k:?}");
            assert!(k.depth < (k.shared_bytes - 1024) / ((k.rows + k.cols) * 128), "{k:?}");
        }
        assert!(HOPPER_VARIANTS.windows(2).all(|w| w[0].rows * w[0].cols > w[1].rows * w[1].cols));
    }

    #[test]
    fn a_product_takes_the_kernel_whose_waves_take_least_time() {
        // The kernel each measured shape ran fastest with on an H200 (132 SMs), N = K = 4096.
        let name = |m| choose_hopper_kernel(132, 1, m, 4096).name;
        assert_eq!(name(4096), "matmul_bf16_hopper_wide");
        assert_eq!(name(1024), "matmul_bf16_hopper_wide");
        assert_eq!(name(256), "matmul_bf16_hopper_small");
        assert_eq!(name(64), "matmul_bf16_hopper_narrow");
        // A batch of products counts its tiles too: 64 x 4 x 16 wide ones fill the GPU.
        assert_eq!(choose_hopper_kernel(132, 64, 512, 4096).name, "matmul_bf16_hopper_wide");
        assert_eq!(choose_hopper_kernel(132, 1, 512, 4096).name, "matmul_bf16_hopper_medium");
    }

    /// The value of `#define NAME VALUE` in the `.cu`.
    fn define(name: &str) -> usize {
        let line = SOURCE.lines().find(|l| l.split_whitespace().take(2).eq(["#define", name])).unwrap();
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    }

    #[test]
    fn the_launcher_knows_each_kernel_as_the_cu_defines_it() {
        let (bm, bn, pad) = (define("TC_BM"), define("TC_BN"), define("TC_PAD"));
        assert_eq!((bm, bn), (TC_TILE, TC_TILE));
        // `... matmul_bf16_fixed(TC_ARGS) { matmul_bf16<64, 3>(TC_PASS); }`: name, depth, stages.
        let kernels: Vec<(String, usize)> = SOURCE
            .lines()
            .filter(|l| l.contains("__global__") && l.contains("matmul_bf16<"))
            .map(|l| {
                let name = l.split('(').nth(1).unwrap().rsplit(' ').next().unwrap().to_string();
                let (_, args) = l.split_once("matmul_bf16<").unwrap();
                let (args, _) = args.split_once('>').unwrap();
                let [depth, stages] = args.split(',').map(|a| a.trim().parse().unwrap()).collect::<Vec<usize>>()[..]
                else {
                    panic!("{l}")
                };
                (name, stages * (bm + bn) * (depth + pad) * 2)
            })
            .collect();
        let known: Vec<(String, usize)> = TENSOR_CORE_VARIANTS.iter().map(|&(n, b)| (n.to_string(), b)).collect();
        assert_eq!(kernels, known);
    }
}
