//! Compiles the BLAKE3 part of the CUDA kernels (kernels/repro.cu) for the host, so that tests
//! can check it without a GPU. Only this test crate links it; the `repro` binary never does.

fn main() {
    println!("cargo:rerun-if-changed=../../kernels/repro.cu");
    println!("cargo:rerun-if-changed=../../kernels/host_test.c");
    cc::Build::new().file("../../kernels/host_test.c").warnings(true).compile("repro_kernels_host");
}
