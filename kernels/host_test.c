/* Host build of the hashing device functions of hash.cu, for tests without a GPU: each
   function runs one pass the way a kernel launch does, one work item after another. */
#define REPRO_HOST_TEST
#include "common.cuh"
#include "hash.cu"

/* Whole chunks as hash_chunks tells them apart, each hashed from the address whole_chunk gives;
   the others by batch_chunk. */
void repro_host_hash_chunks(const u64* views, const u64* prefix, u64 n, u32* cvs) {
  for (u64 item = 0; item < prefix[n]; item++) {
    u64 index = 0;
    u64 address = whole_chunk(views, prefix, n, item, &index);
    if (address != 0) {
      u32 cv[8];
      whole_chunk_cv((const unsigned char*)address, index, cv);
      store32(cvs + 8 * item, cv);
    } else {
      batch_chunk(views, prefix, n, item, cvs);
    }
  }
}

/* hash_parents's groups, each merged level by level in a local array. */
void repro_host_hash_parents(const u64* rows, const u64* prefix, u64 n, u32* nodes) {
  for (u64 item = 0; item < prefix[n]; item++) {
    u64 from, count, to;
    u64 depth = parent_group(rows, prefix, n, item, &from, &count, &to);
    u32 level[8 << BLOCK_LEVELS];
    for (u64 i = 0; i < 8 * count; i++) level[i] = nodes[8 * from + i];
    merge_levels(level, count, depth);
    for (int w = 0; w < 8; w++) nodes[8 * to + w] = level[w];
  }
}

void repro_host_hash_roots(const u64* roots, u64 n, const u32* nodes, u32* hashes) {
  for (u64 k = 0; k < n; k++) batch_root(roots, k, nodes, hashes);
}

void repro_host_copy_views(const u64* views, const u64* prefix, const u64* out_at, u64 n, unsigned char* out) {
  for (u64 item = 0; item < prefix[n]; item++) batch_copy(views, prefix, out_at, n, item, out);
}

/* The leaf pass: whole chunks as xxh3_leaves tells them apart (where the GPU reads them with
   four lanes each, here by one thread), the others by batch_leaf. */
void repro_host_xxh3_leaves(const u64* pieces, const u64* prefix, u64 n) {
  for (u64 item = 0; item < prefix[n]; item++) {
    u64* leaf = 0;
    u64 address = whole_leaf_chunk(pieces, prefix, n, item, &leaf);
    if (address != 0) {
      *leaf = xxh3_leaf((const unsigned char*)address, 1024);
    } else {
      batch_leaf(pieces, prefix, n, item);
    }
  }
}
