//! Compiles the hashing functions of the CUDA kernels (kernels/hash.cu) for the host, so that
//! tests can check them without a GPU. Only this test crate links it; the `repro` binary never
//! does.

fn main() {
    println!("cargo:rerun-if-changed=../../kernels/common.cuh");
    println!("cargo:rerun-if-changed=../../kernels/hash.cu");
    println!("cargo:rerun-if-changed=../../kernels/host_test.c");
    cc::Build::new().file("../../kernels/host_test.c").warnings(true).compile("repro_kernels_host");
}
