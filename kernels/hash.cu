// BLAKE3 over device memory, for many tensor views in one launch per pass: one work item per
// 1024-byte chunk computes the chunk's chaining value, parent levels are merged pairwise (an odd
// last node moves up unchanged; up to eight levels per launch, by a block of threads per output
// node) until two nodes remain, and one work item per view makes the root. This is exactly BLAKE3's left-complete tree, so the result
// equals the blake3 crate's hash of the same bytes. A copy pass gathers views' elements for
// values the host keeps.
//
// Only device functions, one per work item; kernels/hash_kernels.cu launches them on the GPU
// (where a warp reads whole chunks together, see hash_chunks), kernels/host_test.c runs them on
// the host (crates/kernel-host-check), so the same code is
// checked against a reference without a GPU. Needs kernels/common.cuh before it.

#define CHUNK_START 1u
#define CHUNK_END 2u
#define PARENT 4u

CONSTANT u32 BLAKE3_IV[8] = {0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
                             0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u};

// BLAKE3 is integer additions, XORs and rotations. On the GPU, XORs, rotations and three-way
// additions run on the integer ALU, which bounds the hashing kernels, while multiply-adds run
// on the FMA pipe beside it. ptxas already moves the `c + d` additions there; writing
// `a + b + m` as two multiply-adds by a one it cannot see (a constant the host could change)
// moves those too: 460 instead of 548 ALU instructions per compression on sm_90 (1.54 rather
// than 1.48 TB/s over a gpt step's tensors on an H100: the ALU is then no longer the only bound).
CONSTANT u32 ONE = 1u;
#define ADD_ON_FMA(x, y) ((x) * ONE + (y))
#define ROTR32(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
#define G(a, b, c, d, x, y)                       \
  do {                                            \
    s[a] = ADD_ON_FMA(ADD_ON_FMA(s[a], s[b]), x); \
    s[d] = ROTR32(s[d] ^ s[a], 16);               \
    s[c] = s[c] + s[d];                           \
    s[b] = ROTR32(s[b] ^ s[c], 12);               \
    s[a] = ADD_ON_FMA(ADD_ON_FMA(s[a], s[b]), y); \
    s[d] = ROTR32(s[d] ^ s[a], 8);                \
    s[c] = s[c] + s[d];                           \
    s[b] = ROTR32(s[b] ^ s[c], 7);                \
  } while (0)
// One round with the message words taken in the order of one row of BLAKE3's schedule.
#define ROUND(m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15) \
  do {                                                                              \
    G(0, 4, 8, 12, m[m0], m[m1]);                                                   \
    G(1, 5, 9, 13, m[m2], m[m3]);                                                   \
    G(2, 6, 10, 14, m[m4], m[m5]);                                                  \
    G(3, 7, 11, 15, m[m6], m[m7]);                                                  \
    G(0, 5, 10, 15, m[m8], m[m9]);                                                  \
    G(1, 6, 11, 12, m[m10], m[m11]);                                                \
    G(2, 7, 8, 13, m[m12], m[m13]);                                                 \
    G(3, 4, 9, 14, m[m14], m[m15]);                                                 \
  } while (0)

// The BLAKE3 compression function, keeping only the chaining value (first 8 output words).
DEVICE void compress(u32 cv[8], const u32 m[16], u64 counter, u32 block_len, u32 flags) {
  u32 s[16] = {cv[0], cv[1], cv[2], cv[3], cv[4], cv[5], cv[6], cv[7],
               BLAKE3_IV[0], BLAKE3_IV[1], BLAKE3_IV[2], BLAKE3_IV[3],
               (u32)counter, (u32)(counter >> 32), block_len, flags};
  ROUND(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  ROUND(2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8);
  ROUND(3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1);
  ROUND(10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6);
  ROUND(12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4);
  ROUND(9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7);
  ROUND(11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13);
  for (int i = 0; i < 8; i++) cv[i] = s[i] ^ s[i + 8];
}

// Loads one 64-byte block of a chunk as 16 little-endian words, zero-padded past `avail`.
// `p` is aligned to `align` bytes (16, 4 or 1): the widest loads that alignment allows.
DEVICE void load_block(const unsigned char* p, u32 avail, u32 align, u32 m[16]) {
  if (avail >= 64 && align >= 16) {
    for (int i = 0; i < 4; i++) load16(p + 16 * i, m + 4 * i);
    return;
  }
  u32 whole = 0;
  if (align >= 4) {
    whole = (avail < 64 ? avail : 64u) / 4;
    for (u32 w = 0; w < whole; w++) m[w] = LOAD(u32, p + 4 * w);
  }
  for (u32 w = whole; w < 16; w++) {
    u32 word = 0;
    for (int b = 0; b < 4; b++) {
      u32 idx = 4 * w + (u32)b;
      u32 byte = idx < avail ? p[idx] : 0u;
      word |= byte << (8 * b);
    }
    m[w] = word;
  }
}

// The (non-root) parent of two chaining values; `out` may be either of them.
DEVICE void parent_cv(const u32 left[8], const u32 right[8], u32 out[8]) {
  u32 m[16];
  for (int i = 0; i < 8; i++) { m[i] = left[i]; m[i + 8] = right[i]; }
  for (int i = 0; i < 8; i++) out[i] = BLAKE3_IV[i];
  compress(out, m, 0, 64, PARENT);
}

// 1b. Batched hashing of many tensor views at once (src/record/device/plan.rs plans the tables).
//
// A view is described by VIEW_WORDS u64 words: the address of its element 0, the element size,
// the number of dimensions (at most VIEW_DIMS, size-1 dims dropped and contiguous dims merged),
// flags (bit 0: contiguous row-major), its byte length, then its dims and its strides in
// elements. Elements are read through the strides, so transposed, broadcast or narrowed views
// are hashed without a contiguous copy. Every thread finds its view by binary search in a
// prefix table (prefix[k] = the first work item of view k, prefix[n] = the total).
#define VIEW_WORDS 21
#define VIEW_DIMS 8
#define ROOT 8u

// The view holding work item `item`: the k with prefix[k] <= item < prefix[k + 1].
DEVICE u64 find_view(const u64* prefix, u64 n, u64 item) {
  u64 lo = 0, hi = n;
  while (hi - lo > 1) {
    u64 mid = (lo + hi) / 2;
    if (prefix[mid] <= item) lo = mid; else hi = mid;
  }
  return lo;
}

// The address of element `e` (in row-major order) of a view.
DEVICE const unsigned char* view_element(const u64* v, u64 e) {
  u64 esize = v[1];
  if (v[3] & 1u) return (const unsigned char*)(v[0] + e * esize);
  u64 off = 0;
  for (int k = (int)v[2] - 1; k >= 0; k--) {
    u64 dim = v[5 + k];
    off += (e % dim) * v[5 + VIEW_DIMS + k];
    e /= dim;
  }
  return (const unsigned char*)(v[0] + off * esize);
}

// A walk through a strided view in row-major order: the current element's index in each
// dimension and its offset in elements. Dividing an element number into indices costs a
// division per dimension, so it is done once per chunk; the next element is then one addition
// (and a carry into the dimension before at the end of a row).
typedef struct {
  u64 idx[VIEW_DIMS];
  u64 off;
} Cursor;

DEVICE void cursor_at(const u64* v, u64 e, Cursor* c) {
  int nd = (int)v[2];
  c->off = 0;
  UNROLL for (int k = VIEW_DIMS - 1; k >= 0; k--) {
    c->idx[k] = 0;
    if (k >= nd) continue;
    u64 dim = v[5 + k];
    c->idx[k] = e % dim;
    c->off += c->idx[k] * v[5 + VIEW_DIMS + k];
    e /= dim;
  }
}

// Moves to the next element (after the last one it wraps to element 0, which no caller reads).
DEVICE void cursor_next(const u64* v, Cursor* c) {
  int nd = (int)v[2];
  UNROLL for (int k = VIEW_DIMS - 1; k >= 0; k--) {
    if (k >= nd) continue;
    u64 stride = v[5 + VIEW_DIMS + k];
    c->off += stride;
    if (++c->idx[k] < v[5 + k]) return;
    c->off -= c->idx[k] * stride;
    c->idx[k] = 0;
  }
}

// Loads the next 64-byte block (`avail` bytes of it, zero-padded) of a strided view from the
// cursor, one element per load; elements are aligned to their size.
DEVICE void load_strided_block(const u64* v, Cursor* c, u32 avail, u32 m[16]) {
  const unsigned char* base = (const unsigned char*)v[0];
  u32 esize = (u32)v[1];
  u32 count = (avail < 64 ? avail : 64u) / esize;
  // A whole block within one contiguous row (rows of a head split off by a transpose, say 64
  // elements each) is read in 16-byte loads where it is aligned for them.
  int nd = (int)v[2];
  if (count * esize == 64 && nd > 0 && v[5 + VIEW_DIMS + nd - 1] == 1 && c->idx[nd - 1] + count <= v[5 + nd - 1]) {
    const unsigned char* p = base + esize * c->off;
    if (((u64)p & 15u) == 0) {
      for (int i = 0; i < 4; i++) load16(p + 16 * i, m + 4 * i);
      // The block's last element is in this row: step there, then on past it.
      c->idx[nd - 1] += count - 1;
      c->off += count - 1;
      cursor_next(v, c);
      return;
    }
  }
  for (int w = 0; w < 16; w++) m[w] = 0;
  if (esize == 4) {
    for (u32 j = 0; j < count; j++, cursor_next(v, c)) m[j] = LOAD(u32, base + 4 * c->off);
  } else if (esize == 2) {
    for (u32 j = 0; j < count; j++, cursor_next(v, c)) m[j / 2] |= (u32)LOAD(u16, base + 2 * c->off) << (16 * (j % 2));
  } else if (esize == 8) {
    for (u32 j = 0; j < count; j++, cursor_next(v, c)) {
      u64 x = LOAD(u64, base + 8 * c->off);
      m[2 * j] = (u32)x;
      m[2 * j + 1] = (u32)(x >> 32);
    }
  } else {
    for (u32 j = 0; j < count; j++, cursor_next(v, c)) {
      const unsigned char* p = base + esize * c->off;
      for (u32 b = 0; b < esize; b++) {
        u32 idx = j * esize + b;
        m[idx / 4] |= (u32)p[b] << (8 * (idx % 4));
      }
    }
  }
}

// Work item `item` of the chunk pass: the chaining value of one 1024-byte chunk of one view,
// written to cvs[8 * item ..]. Views hold more than one chunk.
DEVICE void batch_chunk(const u64* views, const u64* prefix, u64 n, u64 item, u32* cvs) {
  u64 k = find_view(prefix, n, item);
  const u64* v = views + VIEW_WORDS * k;
  u64 index = item - prefix[k];
  u64 start = index * 1024;
  u64 len = v[4] - start < 1024 ? v[4] - start : 1024;
  int contiguous = (int)(v[3] & 1u);
  u64 address = v[0] + start;
  Cursor c;
  c.off = 0;
  if (!contiguous) {
    cursor_at(v, start / v[1], &c);
    // A strided view whose innermost dimension is contiguous (a broadcast weight, a window of
    // rows) reads a chunk that lies within one of its rows as contiguous memory, in wide loads.
    int nd = (int)v[2];
    if (nd > 0 && v[5 + VIEW_DIMS + nd - 1] == 1 && (c.idx[nd - 1] + len / v[1]) <= v[5 + nd - 1]) {
      contiguous = 1;
      address = v[0] + c.off * v[1];
    }
  }
  u32 align = (address & 15u) == 0 ? 16u : (address & 3u) == 0 ? 4u : 1u;
  u32 cv[8];
  for (int i = 0; i < 8; i++) cv[i] = BLAKE3_IV[i];
  u32 blocks = (u32)((len + 63) / 64);
  for (u32 b = 0; b < blocks; b++) {
    u32 m[16];
    u32 avail = (u32)(len - 64 * b);
    if (contiguous) load_block((const unsigned char*)(address + 64 * b), avail, align, m);
    else load_strided_block(v, &c, avail, m);
    u32 flags = (b == 0 ? CHUNK_START : 0u) | (b + 1 == blocks ? CHUNK_END : 0u);
    compress(cv, m, index, avail < 64 ? avail : 64u, flags);
  }
  store32(cvs + 8 * item, cv);
}

// The address of work item `item`'s chunk, and its index in its view, when it is a whole
// 1024-byte chunk of contiguous memory at a 16-byte aligned address (most chunks of a step);
// 0 otherwise. Such chunks are read by a whole warp at once (hash_chunks).
DEVICE u64 whole_chunk(const u64* views, const u64* prefix, u64 n, u64 item, u64* index) {
  u64 k = find_view(prefix, n, item);
  const u64* v = views + VIEW_WORDS * k;
  *index = item - prefix[k];
  u64 start = *index * 1024;
  u64 address = v[0] + start;
  return (v[3] & 1u) && v[4] - start >= 1024 && (address & 15u) == 0 ? address : 0;
}

// The chaining value of the whole chunk at `p` (see whole_chunk), chunk `index` of its view, read
// by this thread alone: the host's counterpart of the warp's staged reads in hash_chunks.
DEVICE void whole_chunk_cv(const unsigned char* p, u64 index, u32 cv[8]) {
  for (int i = 0; i < 8; i++) cv[i] = BLAKE3_IV[i];
  for (u32 b = 0; b < 16; b++) {
    u32 m[16];
    load_block(p + 64 * b, 64, 16, m);
    compress(cv, m, index, 64, (b == 0 ? CHUNK_START : 0u) | (b == 15 ? CHUNK_END : 0u));
  }
}

// Levels one parent launch merges, at most: each output node's block of threads holds its
// 2^BLOCK_LEVELS input nodes in shared memory (hash_parents in hash_kernels.cu).
#define BLOCK_LEVELS 8

// Work item `item` of one parent pass: where its input nodes start, how many there are, where its
// output node goes; returns the levels it merges. Row r of `rows` is (first input node, input
// node count, first output node, depth) of one view's tree, nodes counted in 8-word chaining
// values. Output j of a view is inputs [j * 2^depth, (j + 1) * 2^depth) merged `depth` levels
// up. The groups are aligned to 2^depth, so a group's pairs are the tree's pairs, and only the
// last group can hold the odd last node.
DEVICE u64 parent_group(const u64* rows, const u64* prefix, u64 n, u64 item, u64* from, u64* count, u64* to) {
  u64 r = find_view(prefix, n, item);
  u64 in = rows[4 * r], n_in = rows[4 * r + 1], depth = rows[4 * r + 3];
  u64 j = item - prefix[r];
  u64 first = j << depth;
  u64 group = (u64)1 << depth;
  *from = in + first;
  *count = n_in - first < group ? n_in - first : group;
  *to = rows[4 * r + 2] + j;
  return depth;
}

// Node i of the level above the `count` nodes at `level`: the parent of nodes 2i and 2i + 1, or
// node 2i when it has no partner.
DEVICE void level_node(const u32* level, u64 count, u64 i, u32 cv[8]) {
  if (2 * i + 1 < count) {
    parent_cv(level + 16 * i, level + 16 * i + 8, cv);
  } else {
    for (int w = 0; w < 8; w++) cv[w] = level[16 * i + w];
  }
}

// Merges the `count` nodes at `level` `depth` levels up, in place, one level at a time: node i
// is written after nodes 2i and 2i + 1 are read, and i <= 2i. The result is node 0. The host's
// counterpart of a hash_parents block, which computes each level's nodes in parallel.
DEVICE void merge_levels(u32* level, u64 count, u64 depth) {
  for (u64 d = 0; d < depth; d++) {
    u64 next = (count + 1) / 2;
    for (u64 i = 0; i < next; i++) {
      u32 cv[8];
      level_node(level, count, i, cv);
      for (int w = 0; w < 8; w++) level[8 * i + w] = cv[w];
    }
    count = next;
  }
}

// The BLAKE3 hash of view `k`: the root parent of its last two nodes, which start at node
// roots[k] of `nodes`.
DEVICE void batch_root(const u64* roots, u64 k, const u32* nodes, u32* hashes) {
  const u32* left = nodes + 8 * roots[k];
  u32 m[16], cv[8];
  for (int i = 0; i < 8; i++) { m[i] = left[i]; m[i + 8] = left[i + 8]; cv[i] = BLAKE3_IV[i]; }
  compress(cv, m, 0, 64, PARENT | ROOT);
  for (int i = 0; i < 8; i++) hashes[8 * k + i] = cv[i];
}

// Work item `item` of the copy pass: one element of one view, written in row-major order at
// byte offset out_at[k] of `out`.
DEVICE void batch_copy(const u64* views, const u64* prefix, const u64* out_at, u64 n, u64 item, unsigned char* out) {
  u64 k = find_view(prefix, n, item);
  const u64* v = views + VIEW_WORDS * k;
  u64 e = item - prefix[k];
  const unsigned char* p = view_element(v, e);
  unsigned char* q = out + out_at[k] + e * v[1];
  for (u64 b = 0; b < v[1]; b++) q[b] = p[b];
}

// 1c. The leaves of the data hash xxh3-1k (docs/trace-format.md, section 5.5): the XXH3-64 of
// each 1 KiB chunk, the last one zero-padded; BLAKE3 over the leaves (the passes above, over the
// leaves' memory) gives the data hash. XXH3 of exactly 1024 bytes takes one path of the xxHash
// specification: eight 64-bit accumulators, stripes 0 to 14 of the chunk accumulated with the
// default secret's words from offset 8 * stripe, stripe 15 as "the last stripe" with the words
// from offset 121, no scrambling (no whole block precedes it), then the accumulators merged with
// the words from offset 11 and avalanched. The secret's words are read here little-endian from
// xxHash's 192-byte default secret.
//
// Pieces of memory are described by 3 u64 words: their address, their length in bytes, and the
// address their leaves go to (u64 each, in chunk order); prefix[k] counts the chunks before
// piece k.
#define XXH3_PRIME64_1 0x9E3779B185EBCA87ull
#define XXH3_AVALANCHE 0x165667919E3779F9ull
CONSTANT u64 XXH3_INIT_ACC[8] = {0xC2B2AE3Dull, 0x9E3779B185EBCA87ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull,
                                 0x85EBCA77C2B2AE63ull, 0x85EBCA77ull, 0x27D4EB2F165667C5ull, 0x9E3779B1ull};
// The secret's word at byte 8 * j: stripe s's accumulator i takes word s + i.
CONSTANT u64 XXH3_STRIPE_KEYS[23] = {
    0xBE4BA423396CFEB8ull, 0x1CAD21F72C81017Cull, 0xDB979083E96DD4DEull, 0x1F67B3B7A4A44072ull, 0x78E5C0CC4EE679CBull,
    0x2172FFCC7DD05A82ull, 0x8E2443F7744608B8ull, 0x4C263A81E69035E0ull, 0xCB00C391BB52283Cull, 0xA32E531B8B65D088ull,
    0x4EF90DA297486471ull, 0xD8ACDEA946EF1938ull, 0x3F349CE33F76FAA8ull, 0x1D4F0BC7C7BBDCF9ull, 0x3159B4CD4BE0518Aull,
    0x647378D9C97E9FC8ull, 0xC3EBD33483ACC5EAull, 0xEB6313FAFFA081C5ull, 0x49DAF0B751DD0D17ull, 0x9E68D429265516D3ull,
    0xFCA1477D58BE162Bull, 0xCE31D07AD1B8F88Full, 0x280416958F3ACB45ull};
// The secret's words at bytes 121 + 8 * i: the last stripe's.
CONSTANT u64 XXH3_LAST_KEYS[8] = {0xEA647378D9C97E9Full, 0xC5C3EBD33483ACC5ull, 0x17EB6313FAFFA081ull, 0xD349DAF0B751DD0Dull,
                                  0x2B9E68D429265516ull, 0x8FFCA1477D58BE16ull, 0x45CE31D07AD1B8F8ull, 0xAF280416958F3ACBull};
// The secret's words at bytes 11 + 8 * j: the merge's.
CONSTANT u64 XXH3_MERGE_KEYS[8] = {0x6DD4DE1CAD21F72Cull, 0xA44072DB979083E9ull, 0xE679CB1F67B3B7A4ull, 0xD05A8278E5C0CC4Eull,
                                   0x4608B82172FFCC7Dull, 0x9035E08E2443F774ull, 0x52283C4C263A81E6ull, 0x65D088CB00C391BBull};

// The low and the high 64 bits of a * b, XORed.
DEVICE u64 mul128_fold64(u64 a, u64 b) {
#ifdef REPRO_HOST_TEST
  unsigned __int128 p = (unsigned __int128)a * b;
  return (u64)p ^ (u64)(p >> 64);
#else
  return __umul64hi(a, b) ^ (a * b);
#endif
}

// The secret's word accumulator i of stripe s of a 1 KiB chunk takes.
DEVICE u64 xxh3_key(u32 s, u32 i) { return s < 15 ? XXH3_STRIPE_KEYS[s + i] : XXH3_LAST_KEYS[i]; }

// One accumulator's step over one 64-bit word `v` of a stripe, `swapped` being the word of the
// neighbouring accumulator (i ^ 1), which XXH3 adds to this one.
DEVICE u64 xxh3_accumulate(u64 acc, u64 v, u64 swapped, u64 key) {
  const u64 keyed = v ^ key;
  return acc + swapped + (u64)(u32)keyed * (keyed >> 32);
}

// The leaf from the sum of the four merged accumulator pairs of a 1024-byte input.
DEVICE u64 xxh3_leaf_finish(u64 merged) {
  u64 h = merged + 1024ull * XXH3_PRIME64_1;
  h ^= h >> 37;
  h *= XXH3_AVALANCHE;
  return h ^ (h >> 32);
}

// XXH3-64 of the `len` bytes at p (at most 1024) zero-padded to 1024, read by one thread.
DEVICE u64 xxh3_leaf(const unsigned char* p, u64 len) {
  const u32 align = ((u64)p & 15u) == 0 ? 16u : ((u64)p & 3u) == 0 ? 4u : 1u;
  u64 acc[8];
  for (int i = 0; i < 8; i++) acc[i] = XXH3_INIT_ACC[i];
  for (u32 s = 0; s < 16; s++) {
    u32 m[16];
    const u32 avail = len > 64u * s ? (u32)(len - 64u * s < 64u ? len - 64u * s : 64u) : 0u;
    load_block(p + 64u * s, avail, avail == 64u ? align : 1u, m);
    u64 v[8];
    for (int i = 0; i < 8; i++) v[i] = (u64)m[2 * i] | ((u64)m[2 * i + 1] << 32);
    for (u32 i = 0; i < 8; i++) acc[i] = xxh3_accumulate(acc[i], v[i], v[i ^ 1u], xxh3_key(s, i));
  }
  u64 merged = 0;
  for (int j = 0; j < 4; j++) merged += mul128_fold64(acc[2 * j] ^ XXH3_MERGE_KEYS[2 * j], acc[2 * j + 1] ^ XXH3_MERGE_KEYS[2 * j + 1]);
  return xxh3_leaf_finish(merged);
}

// Work item `item` of the leaf pass, read by one thread: the leaf of one chunk of one piece.
DEVICE void batch_leaf(const u64* pieces, const u64* prefix, u64 n, u64 item) {
  const u64 k = find_view(prefix, n, item);
  const u64* r = pieces + 3 * k;
  const u64 j = item - prefix[k], start = 1024 * j;
  const u64 len = r[1] - start < 1024 ? r[1] - start : 1024;
  ((u64*)r[2])[j] = xxh3_leaf((const unsigned char*)(r[0] + start), len);
}

// The address of work item `item`'s chunk when it is a whole 1024-byte chunk at a 16-byte aligned
// address (read by four threads at once, 16 bytes each, xxh3_leaves), and where its leaf goes; 0
// otherwise.
DEVICE u64 whole_leaf_chunk(const u64* pieces, const u64* prefix, u64 n, u64 item, u64** leaf) {
  const u64 k = find_view(prefix, n, item);
  const u64* r = pieces + 3 * k;
  const u64 j = item - prefix[k], address = r[0] + 1024 * j;
  *leaf = (u64*)r[2] + j;
  return r[1] - 1024 * j >= 1024 && (address & 15u) == 0 ? address : 0;
}
