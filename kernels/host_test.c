/* Host build of the BLAKE3 device functions in repro.cu, for tests without a GPU. */
#define REPRO_HOST_TEST
#include "repro.cu"

void repro_host_chunk_cv(const unsigned char* p, unsigned int len, unsigned long long index, unsigned int out[8]) {
  chunk_cv(p, len, index, 0, out);
}

void repro_host_parent_cv(const unsigned int left[8], const unsigned int right[8], unsigned int out[8]) {
  parent_cv(left, right, out);
}
