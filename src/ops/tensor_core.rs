//! The tensor-core product's kernels (kernels/matmul_bf16.cu) as their launcher knows them: the
//! tile, and each kernel's name and shared memory. The numbers repeat the `.cu`'s; a test reads
//! the `.cu` and checks them, on any machine.

/// Tiles of the tensor-core kernels: 128 x 128 outputs a block of 256 threads.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) const TC_TILE: usize = 128;

/// The tensor-core kernels: name, and shared memory (3 slices in flight x both operands' 128
/// rows x (slice depth + 8 padding) x 2 bytes, the `.cu`'s `TC_SHARED`). The first is the one
/// products use; the other tiles K otherwise, and must give the same bits (gpu-check).
pub const TENSOR_CORE_VARIANTS: [(&str, usize); 2] =
    [("matmul_bf16_fixed", 3 * 256 * 72 * 2), ("matmul_bf16_fixed_k32", 3 * 256 * 40 * 2)];

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = include_str!("../../kernels/matmul_bf16.cu");

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
