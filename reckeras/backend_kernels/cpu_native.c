/* CPU kernels of reckeras's sparse front end (see cpu_native.py).
 *
 * Plain C99 over raw pointers, compiled once per machine and called through
 * ctypes. Each function is the loop that the vectorized torch reference
 * expresses with whole-tensor ops; they agree exactly except for the order
 * of floating-point sums (tests compare with a tolerance).
 *
 * The loops whose iterations write disjoint memory run on ``threads``
 * threads (torch's intra-op thread count, passed in by cpu_native.py): each
 * thread takes one contiguous range and walks it in order, so every sum is
 * taken in the same order as with one thread and the result does not depend
 * on the thread count.
 *
 * The threads are OpenMP's: the library links libgomp by its soname, which
 * resolves to the copy torch already loaded, so these loops run on torch's
 * own intra-op threads. (Threads of our own competed for the cores with
 * torch's OpenMP threads, which spin for a while after each parallel op:
 * a 0.1 ms loop took ~1 ms inside a training step.) Built without OpenMP
 * the pragmas are ignored and every loop runs on the calling thread.
 *
 * Memory safety: the kernels trust the sizes they are given (counts, dims,
 * bounds, the capacity of the hash map and of the bucket index's arrays), which
 * cpu_native.py checks against
 * the tensors before the call, with their dtypes and layouts. Every index
 * *value* that addresses memory is checked here against its bound before
 * any memory is touched through it, and a bad one is reported in the return
 * value (the wrapper raises) with nothing written the caller can see:
 * outputs are fresh buffers, and the update checks its rows before its
 * first write. (Keys need no check: a key's slot is masked by the map's
 * capacity, its directory entry by the bucket index's depth. An insert into a
 * full map stops and says so instead of probing forever; the bucket index's
 * directory entries and rows are checked as they are read.) A check costs
 * 0-4% of its kernel on a dlrm batch; where the
 * checks sit, and why there, is noted at each kernel.
 *
 * Table rows are float32, float16 or bfloat16 (ROWS_* below; C has no
 * portable type for either half, so they are converted by bit manipulation,
 * which every compiler and CPU runs the same). Arithmetic is float32; the
 * update stores a half row by stochastic rounding (round_half), bit for bit
 * as sparse_optimizers.stochastic_round_reference does.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* Below this many items a loop stays on the calling thread: handing work to
 * other threads costs more than the work. */
#define MIN_ITEMS_PER_THREAD 16384
#define MAX_THREADS 64

#define EMPTY INT64_MIN

static inline uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* ---- row dtypes ---------------------------------------------------------------- */

#define ROWS_F32 0
#define ROWS_F16 1
#define ROWS_BF16 2

static inline uint32_t float_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float bf16_to_float(uint16_t h) { return bits_float((uint32_t)h << 16); }

/* The two conversions below are branch-free (selects, not branches), so
 * that the loops over a row's values vectorize. */

/* Exact for every float16, subnormals included: the exponent is rebiased by
 * one float multiply (exact: a power of two), inf and NaN patched after. */
static inline float f16_to_float(uint16_t h) {
    uint32_t magnitude = h & 0x7fffu;
    uint32_t bits = float_bits(bits_float(magnitude << 13) * 0x1p112f);
    bits |= magnitude >= 0x7c00u ? 0x7f800000u : 0u;           /* inf, NaN */
    return bits_float(bits | ((uint32_t)(h & 0x8000u) << 16));
}

/* Round to nearest, ties to even (as torch's .to(torch.float16)); above the
 * largest float16 -> inf, NaN -> a quiet NaN. */
static inline uint16_t float_to_f16(float f) {
    uint32_t x = float_bits(f);
    uint32_t sign = x & 0x80000000u;
    x ^= sign;
    /* >= 65536, inf or NaN */
    uint32_t special = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
    /* Below 2^-14 (a subnormal or 0): adding 0.5 aligns the value's bits to
     * float16's subnormal step, and the float addition rounds to nearest even. */
    uint32_t subnormal = float_bits(bits_float(x) + 0.5f) - 0x3f000000u;
    uint32_t normal = (x + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((x >> 13) & 1u)) >> 13;
    uint32_t out = x >= 0x47800000u ? special : x < 0x38800000u ? subnormal : normal;
    return (uint16_t)(out | (sign >> 16));
}

/* The murmur3 32-bit finalizer: every output bit depends on every input bit. */
static inline uint32_t fmix32(uint32_t h) {
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    return h ^ (h >> 16);
}

/* Stochastic rounding of x to a half type: a pseudo-random number below the
 * dropped bits' unit (16 bits for bfloat16, 13 for float16), the top bits of
 * a hash of x's bits, the column and the update's seed, is added to x's bits and the
 * dropped bits are cleared. So x rounds away from zero with probability
 * (its distance to the half value below) / (the half step), and an update
 * smaller than a half step still moves the row on average. Bit for bit
 * sparse_optimizers.stochastic_round_reference; below float16's normal
 * range the last conversion rounds to nearest. */
static inline uint16_t round_half(float x, int dtype, uint32_t seed, int64_t column) {
    uint32_t bits = float_bits(x);
    int dropped = dtype == ROWS_BF16 ? 16 : 13;
    uint32_t noise = fmix32((bits ^ seed) + (uint32_t)column * 0x9e3779b9u) >> (32 - dropped);
    uint32_t rounded = ((bits + noise) >> dropped) << dropped;
    return dtype == ROWS_BF16 ? (uint16_t)(rounded >> 16) : float_to_f16(bits_float(rounded));
}

static inline float half_to_float(uint16_t h, int dtype) {
    return dtype == ROWS_BF16 ? bf16_to_float(h) : f16_to_float(h);
}

static inline int64_t row_bytes(int dtype, int64_t dim) {
    return dim * (dtype == ROWS_F32 ? 4 : 2);
}

typedef void (*range_fn)(void *context, int64_t start, int64_t end);

/* Splits [0, n) into ``threads`` even ranges and runs fn on each. ``work``
 * (the items the loop touches) decides how many threads are worth using. */
static void parallel_ranges(int threads, int64_t n, int64_t work, range_fn fn,
                            void *context) {
    int64_t most = work / MIN_ITEMS_PER_THREAD;
    if (threads > most) threads = (int)most;
    if (threads > n) threads = (int)n;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads <= 1) { fn(context, 0, n); return; }
    #pragma omp parallel for num_threads(threads) schedule(static, 1)
    for (int t = 0; t < threads; t++)
        fn(context, n * t / threads, n * (t + 1) / threads);
}

/* keys = mix64(ids) ^ salt of each id's slot; slot s holds the next
 * slot_counts[s] ids (the packed batch is slot-major). */
struct table_keys_args {
    const int64_t *ids, *salt, *slot_counts;
    int64_t num_slots;
    int64_t *keys;
};

static void table_keys_range(void *context, int64_t start, int64_t end) {
    struct table_keys_args *a = (struct table_keys_args *)context;
    int64_t slot = 0, slot_end = 0;
    while (slot < a->num_slots && slot_end + a->slot_counts[slot] <= start)
        slot_end += a->slot_counts[slot++];
    for (int64_t i = start; i < end; i++) {
        while (i >= slot_end + a->slot_counts[slot]) slot_end += a->slot_counts[slot++];
        a->keys[i] = (int64_t)(mix64((uint64_t)a->ids[i]) ^ (uint64_t)a->salt[slot]);
    }
}

/* Returns 0, or -1 (nothing written) unless the counts are non-negative
 * and sum to n. */
int rk_table_keys(const int64_t *ids, int64_t n, const int64_t *salt,
                  const int64_t *slot_counts, int64_t num_slots, int64_t *keys,
                  int threads) {
    int64_t total = 0;
    for (int64_t s = 0; s < num_slots; s++) {
        int64_t count = slot_counts[s];
        if (count < 0 || count > n - total) return -1;   /* so the sum cannot overflow */
        total += count;
    }
    if (total != n) return -1;
    struct table_keys_args a = {ids, salt, slot_counts, num_slots, keys};
    parallel_ranges(threads, n, n, table_keys_range, &a);
    return 0;
}

/* out[i, j] = (float)((2 * u - 1) * scale) with u the top 53 bits of
 * mix64(mix64(keys[i] ^ seed_mix) + j) over 2^53, as hashing.initial_rows
 * computes it, with seed_mix = mix64(seed). */
struct initial_rows_args {
    const int64_t *keys;
    int64_t dim;
    uint64_t seed_mix;
    double scale;
    float *out;
};

static void initial_rows_range(void *context, int64_t start, int64_t end) {
    struct initial_rows_args *a = (struct initial_rows_args *)context;
    for (int64_t i = start; i < end; i++) {
        uint64_t base = mix64((uint64_t)a->keys[i] ^ a->seed_mix);
        for (int64_t j = 0; j < a->dim; j++) {
            double unit = (double)(mix64(base + (uint64_t)j) >> 11) * 0x1p-53;
            a->out[i * a->dim + j] = (float)((2.0 * unit - 1.0) * a->scale);
        }
    }
}

void rk_initial_rows(const int64_t *keys, int64_t n, int64_t dim, int64_t seed,
                     double scale, float *out, int threads) {
    struct initial_rows_args a = {keys, dim, mix64((uint64_t)seed), scale, out};
    parallel_ranges(threads, n, n * dim, initial_rows_range, &a);
}

/* How many keys ahead the loops prefetch the memory they will touch. A
 * lookup is a cache miss into a table much larger than the caches;
 * prefetching keeps several misses in flight instead of waiting on each in
 * turn. The other loops prefetch the rows they will gather the same way. */
#define PREFETCH_AHEAD 16

/* ---- the open-addressing hash map (hash_table.py) ---------------------------------- */

/* A key's home slot: the top log2(capacity) bits of key * GOLDEN
 * (Fibonacci hashing), as hash_table._home computes it. ``shift`` is
 * 64 - log2(capacity); a capacity of 1 has every key at slot 0. */
static inline uint64_t home_slot(int64_t key, int shift) {
    return shift >= 64 ? 0 : ((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> shift;
}

static inline int home_shift(int64_t capacity) {
    int bits = 0;
    while (((int64_t)1 << bits) < capacity) bits++;
    return 64 - bits;
}

struct probe_args {
    int64_t *slot_keys, *slot_rows;
    int64_t capacity;
    uint64_t mask;
    int shift;
    const int64_t *keys;
    int64_t *rows;
    int64_t num_rows;
    int insert;
    int full;               /* set when an insert found neither its key nor a free slot */
};

static inline int64_t storable(int64_t key) { return key == EMPTY ? EMPTY + 1 : key; }

static void probe_range(void *context, int64_t start, int64_t end) {
    struct probe_args *a = (struct probe_args *)context;
    for (int64_t i = start; i < end; i++) {
        if (i + PREFETCH_AHEAD < end) {
            uint64_t ahead = home_slot(storable(a->keys[i + PREFETCH_AHEAD]), a->shift);
            __builtin_prefetch(&a->slot_keys[ahead], 0, 1);
            __builtin_prefetch(&a->slot_rows[ahead], 0, 1);
        }
        int64_t key = storable(a->keys[i]);
        uint64_t slot = home_slot(key, a->shift);
        for (int64_t probes = 0;; probes++) {
            /* Every slot seen: the key is absent, and a full map has no slot
             * for it. Without this bound such a key would probe forever. */
            if (probes == a->capacity) {
                a->rows[i] = -1;
                if (a->insert) { a->full = 1; return; }
                break;
            }
            int64_t seen = a->slot_keys[slot];
            if (seen == key) { a->rows[i] = a->slot_rows[slot]; break; }
            if (seen == EMPTY) {
                if (a->insert) {
                    /* Atomic (plain stores on x86-64): a rehash may read the
                     * map from another thread meanwhile (see rk_rehash). */
                    __atomic_store_n(&a->slot_keys[slot], key, __ATOMIC_RELAXED);
                    __atomic_store_n(&a->slot_rows[slot], a->num_rows, __ATOMIC_RELAXED);
                    a->rows[i] = a->num_rows++;
                } else {
                    a->rows[i] = -1;
                }
                break;
            }
            slot = (slot + 1) & a->mask;
        }
    }
}

/* Linear-probing find-or-insert into a map of ``capacity`` (a power of two)
 * slots. New keys get rows num_rows, num_rows+1, ... in order of first
 * appearance, so inserting stays on one thread; a pure find (insert == 0:
 * absent keys resolve to -1, nothing changes) is split over ``threads``.
 * Returns the new row count, or -1 when an insert found the map full (the
 * keys before that one are inserted). */
int64_t rk_find_or_insert(int64_t *slot_keys, int64_t *slot_rows, int64_t capacity,
                          const int64_t *keys, int64_t n, int64_t *rows,
                          int64_t num_rows, int insert, int threads) {
    struct probe_args a = {slot_keys, slot_rows, capacity, (uint64_t)capacity - 1,
                           home_shift(capacity), keys, rows, num_rows, insert, 0};
    parallel_ranges(insert ? 1 : threads, n, n, probe_range, &a);
    return a.full ? -1 : a.num_rows;
}

/* Moves every key of an old map whose row lies in [0, rows_below), with its
 * row, into a new empty map of new_capacity slots (a power of two). The old
 * slots are walked in order, which keeps the writes almost sequential: with
 * Fibonacci hashing a key's home in a map twice as large is its old home
 * times two, plus one bit, so the pass streams through both maps. Inserting
 * the keys in any other order misses the cache once per key (2^27 keys took
 * 20 s that way).
 *
 * The old map may be growing on another thread meanwhile (a table builds its
 * next index in the background, see table.py): every slot is read with
 * atomic loads, and rows_below is the row count when the pass began. A key
 * inserted later may be seen without its row yet (-1) or not at all; the
 * bound skips it either way, and the caller inserts those keys afterwards.
 * Returns the number of keys moved, or -1 when the new map has no free slot
 * left for one (then the new map is incomplete). */
int64_t rk_rehash(const int64_t *old_keys, const int64_t *old_rows, int64_t old_capacity,
                  int64_t rows_below, int64_t *new_keys, int64_t *new_rows,
                  int64_t new_capacity) {
    uint64_t mask = (uint64_t)new_capacity - 1;
    int shift = home_shift(new_capacity);
    int64_t moved = 0;
    for (int64_t s = 0; s < old_capacity; s++) {
        int64_t key = __atomic_load_n(&old_keys[s], __ATOMIC_RELAXED);
        if (key == EMPTY) continue;
        int64_t row = __atomic_load_n(&old_rows[s], __ATOMIC_RELAXED);
        if ((uint64_t)row >= (uint64_t)rows_below) continue;      /* also row < 0 */
        if (moved == new_capacity) return -1;
        uint64_t slot = home_slot(key, shift);
        while (new_keys[slot] != EMPTY) slot = (slot + 1) & mask;
        new_keys[slot] = key;
        new_rows[slot] = row;
        moved++;
    }
    return moved;
}


/* ---- the bucketized index (bucket_index.py) --------------------------------------
 *
 * Extendible hashing over buckets of two cache lines (128 bytes): 25 slots
 * of one byte of key digest (0: free) and the int32 row + 1 (0: free), and
 * the bucket's local depth; the digests, the depth and the first 9 rows fill
 * the first line. The keys stay in the table's key array (``arena``), read
 * only to confirm a digest match. A key has two candidate buckets, its
 * first directory[a >> (32 - G)] and its second directory[b >> (32 - G)],
 * for the two 32-bit halves a, b of mix64(key) and the global depth G; it is
 * stored in its first while that has a free slot, else in its second. A
 * full bucket pair splits the bucket of smaller local depth: the directory
 * doubles in place when that depth is G, the bucket's keys whose hash has
 * the next bit set move to a new bucket appended at the end, so the index
 * grows one bucket at a time and never holds a second copy of itself. Bit
 * for bit what bucket_index.py's reference computes, up to where in a
 * bucket a key sits and the numbering of the rows created by one call. */
#define BUCKET_SLOTS 25
#define BAD_INDEX (-1)       /* a directory entry or a slot out of its bounds */

struct bucket {              /* 128 bytes: bucket_index.WORDS int32 words */
    uint8_t digest[BUCKET_SLOTS];
    uint8_t depth;
    uint8_t zero[2];
    int32_t row[BUCKET_SLOTS];   /* row + 1: rows 0-8 share the digests' line */
};
_Static_assert(sizeof(struct bucket) == 128, "a bucket is two cache lines");

struct bucket_index {
    struct bucket *buckets;  /* [bucket_capacity] */
    int32_t *directory;      /* [directory_capacity], 2^G entries in use */
    int64_t num_buckets, bucket_capacity, directory_capacity;
    int depth;               /* G */
    int64_t *arena;          /* each row's key */
    int64_t num_rows;        /* rows whose keys the arena holds */
};

static inline void bucket_hashes(int64_t key, uint64_t *a, uint64_t *b, uint8_t *digest) {
    uint64_t h = mix64((uint64_t)key);
    *a = h >> 32;
    *b = h & 0xffffffffu;
    uint8_t d = (uint8_t)(((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> 56);
    *digest = d ? d : 1;
}

/* The directory entry of a 32-bit hash (a shift by 32 is 0 in 64 bits). */
static inline uint64_t bucket_entry(uint64_t hash, int depth) { return hash >> (32 - depth); }

/* Bit k set for each slot k of a bucket whose digest equals `digest`, no
 * branch. With SSE2 (every x86-64) one compare of the 16 bytes that hold
 * the digests; elsewhere each word's flags (bit 8k + 7 of byte k) gathered
 * into one byte by a multiply (its partial products land on distinct bits,
 * so nothing carries into the top byte). */
#if defined(__SSE2__)
#include <emmintrin.h>
static inline uint32_t bucket_match_mask(const struct bucket *b, uint8_t digest) {
    __m128i wanted = _mm_set1_epi8((char)digest);
    __m128i low = _mm_loadu_si128((const __m128i *)b->digest);
    __m128i high = _mm_loadu_si128((const __m128i *)(b->digest + 16));
    return ((uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(low, wanted)) |
            (uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(high, wanted)) << 16) &
           ((1u << BUCKET_SLOTS) - 1);
}
#else
/* Bit 8k + 7 set for each byte k of v that is 0, exactly (SWAR: eight bytes
 * at once, no branch a byte). */
static inline uint64_t zero_bytes(uint64_t v) {
    const uint64_t low7 = 0x7F7F7F7F7F7F7F7FULL;
    return ~(((v & low7) + low7) | v | low7);
}

static inline uint32_t bucket_match_mask(const struct bucket *b, uint8_t digest) {
    const uint64_t gather = 0x0102040810204080ULL;
    uint32_t mask = 0;
    for (int word = 0; word < 4; word++) {
        uint64_t v;
        memcpy(&v, b->digest + 8 * word, 8);
        uint64_t flags = zero_bytes(v ^ (0x0101010101010101ULL * digest)) >> 7;
        mask |= (uint32_t)((flags * gather) >> 56) << (8 * word);
    }
    return mask & ((1u << BUCKET_SLOTS) - 1);
}
#endif

/* The row of a bucket's first slot in `mask` (-1 for a free slot: a
 * corrupt index), NO_MATCH for an empty mask. */
#define NO_MATCH INT64_MIN
static inline int64_t bucket_first_row(const struct bucket *b, uint32_t mask) {
    int j = __builtin_ctz(mask | 1u << 31);          /* 31: none, past the slots */
    int64_t row = (int64_t)b->row[j < BUCKET_SLOTS ? j : 0] - 1;  /* selects, no branch */
    return j < BUCKET_SLOTS ? row : NO_MATCH;
}

/* The row of key in bucket, -1 when it is not there, BAD_INDEX - 1 for a
 * slot whose row lies outside the arena. */
static inline int64_t bucket_row(const struct bucket_index *x, int64_t bucket, int64_t key,
                                 uint8_t digest) {
    const struct bucket *b = x->buckets + bucket;
    for (uint32_t m = bucket_match_mask(b, digest); m; m &= m - 1) {
        int64_t row = (int64_t)b->row[__builtin_ctz(m)] - 1;
        if ((uint64_t)row >= (uint64_t)x->num_rows) return BAD_INDEX - 1;
        if (x->arena[row] == key) return row;
    }
    return -1;
}

/* The row of key (-1: absent), or BAD_INDEX - 1 for a corrupt index. */
static inline int64_t bucket_find_one(const struct bucket_index *x, int64_t key) {
    uint64_t a, b;
    uint8_t digest;
    bucket_hashes(key, &a, &b, &digest);
    int64_t first = x->directory[bucket_entry(a, x->depth)];
    int64_t second = x->directory[bucket_entry(b, x->depth)];
    if ((uint64_t)first >= (uint64_t)x->num_buckets ||
        (uint64_t)second >= (uint64_t)x->num_buckets) return BAD_INDEX - 1;
    int64_t row = bucket_row(x, first, key, digest);
    if (row != -1 || second == first) return row;
    return bucket_row(x, second, key, digest);
}

struct bucket_find_args {
    const struct bucket_index *index;
    const int64_t *keys;
    int64_t *rows;
    int bad;
};

/* A lookup chains three misses (directory entry, the bucket's lines, the
 * arena's key). Keys are resolved a chunk at a time, a software pipeline
 * over each link of the chain: while key i is matched in a bucket, that
 * bucket of key i + AHEAD and the directory entry of key i + 2 AHEAD are on
 * their way, so misses overlap without a prefetch waiting on a load (or so
 * many in flight that the core drops some). Pass 1 takes the first digest
 * match in the key's first bucket, pass 2 confirms it against the arena;
 * the keys left (in their second bucket, or absent) take the same two
 * passes through their second bucket. Only a key whose bucket had two
 * matching digests and neither confirmed takes the full walk. */
#define FIND_CHUNK 256
#define AHEAD 8

/* Each key's directory entries and digest (no memory touched). */
static void bucket_chunk_hashes(const struct bucket_index *x, const int64_t *keys,
                                const int64_t *which, int64_t n, uint64_t *first,
                                uint64_t *second, uint8_t *digest) {
    for (int64_t i = 0; i < n; i++) {
        bucket_hashes(keys[which ? which[i] : i], &first[i], &second[i], &digest[i]);
        first[i] = bucket_entry(first[i], x->depth);
        second[i] = bucket_entry(second[i], x->depth);
    }
}

/* Both lines of a bucket on their way. */
static inline void bucket_prefetch(const struct bucket_index *x, uint64_t bucket) {
    __builtin_prefetch((const char *)(x->buckets + bucket), 0, 3);
    __builtin_prefetch((const char *)(x->buckets + bucket) + 64, 0, 3);
}

/* One step of the pipeline at position i of `order` (NULL: 0, 1, ...): the
 * directory entry of i + 2 AHEAD prefetched, the bucket of i + AHEAD
 * prefetched (its entry read into bucket[i + AHEAD]). */
static inline void bucket_pipeline(const struct bucket_index *x, int64_t i, int64_t n,
                                   const int64_t *order, const uint64_t *entry,
                                   uint64_t *bucket) {
    if (i + 2 * AHEAD < n)
        __builtin_prefetch(&x->directory[entry[order ? order[i + 2 * AHEAD] : i + 2 * AHEAD]],
                           0, 3);
    int64_t j = i + AHEAD;
    if (j < n) {
        bucket[j] = (uint32_t)x->directory[entry[order ? order[j] : j]];
        if (bucket[j] < (uint64_t)x->num_buckets) bucket_prefetch(x, bucket[j]);
    }
}

/* The pipeline's prologue: the first positions' entries and buckets. */
static inline void bucket_pipeline_start(const struct bucket_index *x, int64_t n,
                                         const int64_t *order, const uint64_t *entry,
                                         uint64_t *bucket) {
    for (int64_t i = 0; i < 2 * AHEAD && i < n; i++)
        __builtin_prefetch(&x->directory[entry[order ? order[i] : i]], 0, 3);
    for (int64_t i = 0; i < AHEAD && i < n; i++) {
        bucket[i] = (uint32_t)x->directory[entry[order ? order[i] : i]];
        if (bucket[i] < (uint64_t)x->num_buckets) bucket_prefetch(x, bucket[i]);
    }
}

/* Passes 1 and 2 over the keys at positions `order` (NULL: all n) through
 * the buckets of their directory entries `entry`: a confirmed key's row
 * goes to rows; the others are listed in `left` (their count returned),
 * `ambiguous` set for those whose bucket held more than one matching
 * digest. Sets a->bad for an entry or a row out of bounds. */
static int64_t bucket_match_pass(struct bucket_find_args *a, const int64_t *keys,
                                 int64_t *rows, int64_t n, const int64_t *order,
                                 const uint64_t *entry, const uint8_t *digest,
                                 int64_t *left, uint8_t *ambiguous) {
    const struct bucket_index *x = a->index;
    uint64_t bucket[FIND_CHUNK];
    int64_t candidate[FIND_CHUNK];
    uint8_t several[FIND_CHUNK];
    bucket_pipeline_start(x, n, order, entry, bucket);
    for (int64_t i = 0; i < n; i++) {
        bucket_pipeline(x, i, n, order, entry, bucket);
        int64_t key = order ? order[i] : i;
        candidate[i] = NO_MATCH;
        several[i] = 0;
        if (bucket[i] >= (uint64_t)x->num_buckets) { a->bad = 1; continue; }
        const struct bucket *b = x->buckets + bucket[i];
        uint32_t mask = bucket_match_mask(b, digest[key]);
        candidate[i] = bucket_first_row(b, mask);
        several[i] = (mask & (mask - 1)) != 0;
    }
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i + AHEAD < n && (uint64_t)candidate[i + AHEAD] < (uint64_t)x->num_rows)
            __builtin_prefetch(&x->arena[candidate[i + AHEAD]], 0, 3);
        int64_t key = order ? order[i] : i, row = candidate[i];
        if ((uint64_t)row < (uint64_t)x->num_rows) {
            if (x->arena[row] == keys[key]) { rows[key] = row; continue; }
        } else if (row != NO_MATCH) {
            a->bad = 1;
        }
        ambiguous[m] = several[i];
        left[m++] = key;
    }
    return m;
}

static void bucket_find_chunk(struct bucket_find_args *a, int64_t start, int64_t end) {
    const struct bucket_index *x = a->index;
    int64_t *rows = a->rows + start;
    const int64_t *keys = a->keys + start;
    int64_t n = end - start;
    uint64_t first[FIND_CHUNK], second[FIND_CHUNK];
    int64_t left[FIND_CHUNK], still[FIND_CHUNK];
    uint8_t digest[FIND_CHUNK], ambiguous[FIND_CHUNK], again[FIND_CHUNK];
    bucket_chunk_hashes(x, keys, NULL, n, first, second, digest);
    int64_t m = bucket_match_pass(a, keys, rows, n, NULL, first, digest, left, ambiguous);
    int64_t k = bucket_match_pass(a, keys, rows, m, left, second, digest, still, again);
    /* Unconfirmed in both: absent, unless a bucket held another match. */
    for (int64_t i = 0, j = 0; i < m; i++) {
        if (j == k || still[j] != left[i]) continue;     /* confirmed in its second */
        int64_t row = -1;
        if (ambiguous[i] || again[j]) {
            row = bucket_find_one(x, keys[left[i]]);
            if (row < -1) { a->bad = 1; row = -1; }
        }
        rows[left[i]] = row;
        j++;
    }
}

static void bucket_find_range(void *context, int64_t start, int64_t end) {
    for (int64_t chunk = start; chunk < end; chunk += FIND_CHUNK)
        bucket_find_chunk((struct bucket_find_args *)context, chunk,
                          chunk + FIND_CHUNK < end ? chunk + FIND_CHUNK : end);
}

static inline int bucket_fill(const struct bucket_index *x, int64_t bucket) {
    /* A free slot's digest is 0. */
    return BUCKET_SLOTS - __builtin_popcount(bucket_match_mask(x->buckets + bucket, 0));
}

/* Doubles the directory in place: entry i becomes entries 2i and 2i + 1
 * (walked from the end, so no entry is overwritten before it is read). */
static int bucket_double_directory(struct bucket_index *x) {
    int64_t size = (int64_t)1 << x->depth;
    if (x->depth == 32 || 2 * size > x->directory_capacity) return 0;
    for (int64_t i = size - 1; i >= 0; i--)
        x->directory[2 * i] = x->directory[2 * i + 1] = x->directory[i];
    x->depth++;
    return 1;
}

/* Splits a full bucket (see the section's comment). Returns 1, 0 when the
 * arrays have no room for it, or BAD_INDEX for a corrupt index. */
static int bucket_split(struct bucket_index *x, int64_t bucket) {
    struct bucket *b = x->buckets + bucket;
    if (b->depth > x->depth) return BAD_INDEX;
    if (x->num_buckets == x->bucket_capacity) return 0;
    if (b->depth == x->depth && !bucket_double_directory(x)) return 0;
    int depth = x->depth;
    int64_t span = (int64_t)1 << (depth - b->depth);
    int64_t keys[BUCKET_SLOTS];
    /* Every member's key first, their misses overlapping. */
    for (int j = 0; j < BUCKET_SLOTS; j++) {
        int64_t row = (int64_t)b->row[j] - 1;
        if (b->digest[j] && (uint64_t)row < (uint64_t)x->num_rows)
            __builtin_prefetch(&x->arena[row], 0, 0);
    }
    int64_t start = -1;
    for (int j = 0; j < BUCKET_SLOTS; j++) {
        if (!b->digest[j]) continue;
        int64_t row = (int64_t)b->row[j] - 1;
        if ((uint64_t)row >= (uint64_t)x->num_rows) return BAD_INDEX;
        keys[j] = x->arena[row];
        if (start < 0) {
            /* The bucket's directory range, from the hash that led a member here. */
            uint64_t ha, hb;
            uint8_t d;
            bucket_hashes(keys[j], &ha, &hb, &d);
            int64_t entry = (int64_t)bucket_entry(ha, depth);
            if (x->directory[entry] != bucket) entry = (int64_t)bucket_entry(hb, depth);
            start = entry & ~(span - 1);
        }
    }
    if (start < 0) return BAD_INDEX;          /* an empty bucket is never split */
    int64_t half = span / 2, fresh = x->num_buckets++;
    for (int64_t e = start + half; e < start + span; e++) x->directory[e] = (int32_t)fresh;
    struct bucket *f = x->buckets + fresh;
    memset(f, 0, sizeof *f);
    f->depth = b->depth = (uint8_t)(b->depth + 1);
    int moved = 0;
    for (int j = 0; j < BUCKET_SLOTS; j++) {
        if (!b->digest[j]) continue;
        uint64_t ha, hb;
        uint8_t d;
        bucket_hashes(keys[j], &ha, &hb, &d);
        int64_t entry = (int64_t)bucket_entry(ha, depth);
        if (entry < start || entry >= start + span) entry = (int64_t)bucket_entry(hb, depth);
        if (entry < start + half) continue;
        f->digest[moved] = b->digest[j];
        f->row[moved++] = b->row[j];
        b->digest[j] = 0;
        b->row[j] = 0;
    }
    return 1;
}

/* Stores a key absent from the index with its row. Returns 1, 0 when the
 * arrays have no room for the splits it needs, or BAD_INDEX. */
static int bucket_place(struct bucket_index *x, int64_t key, int64_t row) {
    uint64_t a, b;
    uint8_t digest;
    bucket_hashes(key, &a, &b, &digest);
    for (;;) {
        int64_t first = x->directory[bucket_entry(a, x->depth)];
        int64_t second = x->directory[bucket_entry(b, x->depth)];
        if ((uint64_t)first >= (uint64_t)x->num_buckets ||
            (uint64_t)second >= (uint64_t)x->num_buckets) return BAD_INDEX;
        /* The first bucket while it has room: most keys are then found in it. */
        int64_t target = bucket_fill(x, first) < BUCKET_SLOTS ? first :
                         bucket_fill(x, second) < BUCKET_SLOTS ? second : -1;
        if (target >= 0) {
            struct bucket *t = x->buckets + target;
            int j = 0;
            while (t->digest[j]) j++;
            t->digest[j] = digest;
            t->row[j] = (int32_t)(row + 1);
            return 1;
        }
        int64_t victim = x->buckets[second].depth < x->buckets[first].depth ? second : first;
        int split = bucket_split(x, victim);
        if (split != 1) return split;
    }
}

/* Rows of keys (duplicates allowed), creating rows num_rows, num_rows + 1,
 * ... for absent keys in the order of their first position (their keys
 * written to the arena) when ``insert``. The lookups run on ``threads``;
 * the inserts on the calling thread. shape holds (num_buckets, G) and is
 * updated. A key that does not fit (no arena row or no room for a split
 * left: the caller grows the arrays and calls again) gets -1, as do absent
 * keys without ``insert``. Returns the new row count, -1 for a corrupt
 * index (a directory entry or a slot's row out of bounds), -2 when no
 * memory was left for the absent keys' positions. */
int64_t rk_bucket_find_or_insert(int32_t *buckets, int32_t *directory, int64_t *shape,
                                 int64_t bucket_capacity, int64_t directory_capacity,
                                 int64_t *arena, int64_t arena_capacity, int64_t num_rows,
                                 const int64_t *keys, int64_t n, int64_t *rows, int insert,
                                 int threads) {
    struct bucket_index x = {(struct bucket *)buckets, directory, shape[0], bucket_capacity,
                             directory_capacity, (int)shape[1], arena, num_rows};
    struct bucket_find_args f = {&x, keys, rows, 0};
    parallel_ranges(threads, n, n, bucket_find_range, &f);
    if (f.bad) return -1;
    if (!insert) return num_rows;
    /* The absent keys one after the other (each split changes the index),
     * their first buckets prefetched a few keys ahead as in the lookups. */
    int64_t *absent = (int64_t *)malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!absent) return -2;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) if (rows[i] < 0) absent[m++] = i;
    int64_t status = 0;
    uint64_t first[FIND_CHUNK], second[FIND_CHUNK], bucket[FIND_CHUNK];
    uint8_t digest[FIND_CHUNK];
    for (int64_t k = 0; k < m && !status; k++) {
        /* Pipelined as the lookups; the splits of a chunk may move the
         * buckets prefetched for it (a prefetch is only a hint). */
        int64_t offset = k % FIND_CHUNK, chunk = m - k + offset < FIND_CHUNK ?
                                                 m - k + offset : FIND_CHUNK;
        if (offset == 0) {
            bucket_chunk_hashes(&x, keys, absent + k, chunk, first, second, digest);
            bucket_pipeline_start(&x, chunk, NULL, first, bucket);
        }
        bucket_pipeline(&x, offset, chunk, NULL, first, bucket);
        int64_t i = absent[k];
        /* A copy of a key this loop already inserted finds it. */
        int64_t row = bucket_find_one(&x, keys[i]);
        if (row < -1) { status = -1; break; }
        if (row < 0 && x.num_rows < arena_capacity && x.num_rows < INT32_MAX) {
            int placed = bucket_place(&x, keys[i], x.num_rows);
            if (placed == BAD_INDEX) { status = -1; break; }
            if (placed) {
                row = x.num_rows++;
                arena[row] = keys[i];
            }
        }
        rows[i] = row;
    }
    free(absent);
    if (status) return status;
    shape[0] = x.num_buckets;
    shape[1] = x.depth;
    return x.num_rows;
}

/* On x86-64 Linux the check below also comes as an AVX2 clone, chosen when
 * the library loads (an ifunc) on CPUs that have AVX2: the baseline build
 * has SSE2 only, two int64 a vector, and the check is bound by instructions,
 * not memory (53k ids: ~9 us with SSE2, ~4 with AVX2). */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* Whether every index[i] lies in [0, bound). Branch-free, so it vectorizes:
 * the sign bit of index | (bound - 1 - index) is set exactly when index < 0
 * or index >= bound (in unsigned arithmetic, which wraps without overflow). */
VECTOR_CLONES
static int all_in_range(const int64_t *index, int64_t n, int64_t bound) {
    uint64_t last = (uint64_t)bound - 1, sign = 0;
    for (int64_t i = 0; i < n; i++) sign |= (uint64_t)index[i] | (last - (uint64_t)index[i]);
    return n == 0 || (bound > 0 && !(sign >> 63));
}

/* The two loops below split their *outputs*: a thread owns the targets in
 * [lo, hi) of the output rows, reads every input and keeps the items that
 * write there, in input order. No two threads write one row and each row's
 * sum is taken in input order, as on one thread.
 *
 * Where the indices are checked, measured on a dlrm batch (53k ids, dim 16,
 * one thread): a target is compared as the loop reads it (it is compared
 * with [lo, hi) anyway, so checking is free); the indices of the rows
 * gathered are checked by all_in_range before the loop (2-4% of the
 * kernel), because a check between the dependent loads of the gather cost
 * 10-13%. Each loop reads its fields into locals and has one index
 * structure: one loop for both kernels ran out of registers. */
#define BAD_TARGET 1                /* target_row[i] outside [0, num_targets) */
#define BAD_SOURCE 2                /* a row gathered outside [0, num_sources) */
#define BAD_THROUGH 4               /* through_index[i] outside [0, num_through) */

struct scatter_args {
    const void *source;             /* rows gathered, [num_sources, dim] */
    int64_t dim;
    int dtype;                      /* ROWS_* of source (aggregate: ROWS_F32) */
    const int64_t *source_row;      /* aggregate: the row of item i */
    const int64_t *through_rows, *through_index;   /* pool: through_rows[through_index[i]] */
    const int64_t *target_row;
    const float *scale;
    int64_t n, num_targets;
    float *out;
    int bad;                        /* BAD_TARGET, or'ed in by every thread */
};

static inline void add_scaled(float *to, const float *from, float scale, int64_t dim) {
    for (int64_t j = 0; j < dim; j++) to[j] += from[j] * scale;
}

static inline void add_scaled_half(float *to, const uint16_t *from, float scale,
                                   int64_t dim, int dtype) {
    if (dtype == ROWS_BF16)
        for (int64_t j = 0; j < dim; j++) to[j] += bf16_to_float(from[j]) * scale;
    else
        for (int64_t j = 0; j < dim; j++) to[j] += f16_to_float(from[j]) * scale;
}

/* Whether this thread (targets lo .. lo + span) writes target; one out of
 * every thread's range, [0, num_targets), sets BAD_TARGET in *bad. */
static inline int owns(int64_t target, int64_t lo, uint64_t span, uint64_t num_targets,
                       int *bad) {
    if ((uint64_t)(target - lo) < span) return 1;
    if ((uint64_t)target >= num_targets) *bad = BAD_TARGET;
    return 0;
}

/* out[target_row[i]] += source[through_rows[through_index[i]]] * scale[i]. */
static void pool_range(void *context, int64_t lo, int64_t hi) {
    struct scatter_args *a = (struct scatter_args *)context;
    const char *source = (const char *)a->source;
    const float *scale = a->scale;
    const int dtype = a->dtype;
    const int64_t *rows = a->through_rows, *index = a->through_index;
    const int64_t *target_row = a->target_row;
    const int64_t dim = a->dim, n = a->n;
    const uint64_t span = (uint64_t)(hi - lo), num_targets = (uint64_t)a->num_targets;
    const int64_t stride = row_bytes(dtype, dim);
    float *out = a->out + lo * dim;
    int bad = 0;
    /* The caller passes uninitialized memory: each thread zeroes the targets
     * it owns (in parallel, and while they are warm in its cache). */
    if (span && dim)   /* an empty output may have no memory at all (NULL) */
        memset(out, 0, (size_t)span * (size_t)dim * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        int64_t target = target_row[i];
        if (!owns(target, lo, span, num_targets, &bad)) continue;
        if (i + PREFETCH_AHEAD < n)
            __builtin_prefetch(source + rows[index[i + PREFETCH_AHEAD]] * stride, 0, 1);
        const char *row = source + rows[index[i]] * stride;
        if (dtype == ROWS_F32)          /* the same branch for every id: predicted */
            add_scaled(out + (target - lo) * dim, (const float *)row, scale[i], dim);
        else
            add_scaled_half(out + (target - lo) * dim, (const uint16_t *)row, scale[i],
                            dim, dtype);
    }
    if (bad) __atomic_fetch_or(&a->bad, bad, __ATOMIC_RELAXED);
}

/* out[target_row[i]] += source[source_row[i]] * scale[i]. */
static void aggregate_range(void *context, int64_t lo, int64_t hi) {
    struct scatter_args *a = (struct scatter_args *)context;
    const float *source = (const float *)a->source, *scale = a->scale;
    const int64_t *source_row = a->source_row, *target_row = a->target_row;
    const int64_t dim = a->dim, n = a->n;
    const uint64_t span = (uint64_t)(hi - lo), num_targets = (uint64_t)a->num_targets;
    float *out = a->out + lo * dim;
    int bad = 0;
    if (span && dim) memset(out, 0, (size_t)span * (size_t)dim * sizeof(float));   /* as in pool_range */
    for (int64_t i = 0; i < n; i++) {
        int64_t target = target_row[i];
        if (!owns(target, lo, span, num_targets, &bad)) continue;
        if (i + PREFETCH_AHEAD < n)
            __builtin_prefetch(source + source_row[i + PREFETCH_AHEAD] * dim, 0, 1);
        add_scaled(out + (target - lo) * dim, source + source_row[i] * dim, scale[i], dim);
    }
    if (bad) __atomic_fetch_or(&a->bad, bad, __ATOMIC_RELAXED);
}

/* out[destination[i]] += weights[unique_rows[unique_index[i]]] * id_weight[i],
 * out zeroed first (it may hold garbage on entry); weights of ROWS_* dtype,
 * out float32. Returns the BAD_* bits of the indices out of range (0: none);
 * then nothing is read through them and out is garbage. */
int rk_pool_forward(const void *weights, int dtype, int64_t num_rows, int64_t dim,
                    const int64_t *unique_rows, int64_t num_unique,
                    const int64_t *unique_index, const int64_t *destination,
                    const float *id_weight, int64_t n, float *out, int64_t num_slots,
                    int threads) {
    if (!all_in_range(unique_index, n, num_unique)) return BAD_THROUGH;
    if (!all_in_range(unique_rows, num_unique, num_rows)) return BAD_SOURCE;
    struct scatter_args a = {weights, dim, dtype, NULL, unique_rows, unique_index,
                             destination, id_weight, n, num_slots, out, 0};
    parallel_ranges(threads, num_slots, n, pool_range, &a);
    return a.bad;
}

/* grads[unique_index[i]] += grad_out[destination[i]] * id_weight[i], grads
 * zeroed first. Returns the BAD_* bits of the indices out of range (0: none);
 * then nothing is read through them and grads is garbage. */
int rk_aggregate(const float *grad_out, int64_t num_slots, int64_t dim,
                 const int64_t *unique_index, const int64_t *destination,
                 const float *id_weight, int64_t n, float *grads, int64_t num_unique,
                 int threads) {
    if (!all_in_range(destination, n, num_slots)) return BAD_SOURCE;
    struct scatter_args a = {grad_out, dim, ROWS_F32, destination, NULL, NULL,
                             unique_index, id_weight, n, num_unique, grads, 0};
    parallel_ranges(threads, num_unique, n, aggregate_range, &a);
    return a.bad;
}

/* kind 0 SGD, 1 Adagrad (state: dim per row), 2 row-wise Adagrad (1 per row). */
struct update_args {
    int kind;
    void *weights;                  /* of ROWS_* dtype */
    float *state;
    int64_t state_width, dim;
    const int64_t *rows;
    const float *grads;
    float lr, eps;
    int dtype;
    uint32_t seed;                  /* of the stochastic rounding (half rows) */
};

/* Row-wise Adagrad's accumulator step for row u (s += mean(g^2)), and the
 * factor of its gradient in the update, lr / (sqrt(s) + eps). */
static inline float rowwise_adagrad_scale(const struct update_args *a, int64_t u,
                                          const float *g) {
    float *s = a->state + a->rows[u] * a->state_width;
    float square = 0.0f;
    for (int64_t j = 0; j < a->dim; j++) square += g[j] * g[j];
    s[0] += square / (float)a->dim;
    return a->lr / (sqrtf(s[0]) + a->eps);
}

static void update_range(void *context, int64_t start, int64_t end) {
    const struct update_args *a = (const struct update_args *)context;
    int64_t dim = a->dim, width = a->state_width;
    float lr = a->lr, eps = a->eps;
    for (int64_t u = start; u < end; u++) {
        if (u + PREFETCH_AHEAD < end) {
            __builtin_prefetch((float *)a->weights + a->rows[u + PREFETCH_AHEAD] * dim, 1, 1);
            if (a->kind != 0)
                __builtin_prefetch(a->state + a->rows[u + PREFETCH_AHEAD] * width, 1, 1);
        }
        float *w = (float *)a->weights + a->rows[u] * dim;
        const float *g = a->grads + u * dim;
        if (a->kind == 0) {
            for (int64_t j = 0; j < dim; j++) w[j] -= lr * g[j];
        } else if (a->kind == 1) {
            float *s = a->state + a->rows[u] * width;
            for (int64_t j = 0; j < dim; j++) {
                s[j] += g[j] * g[j];
                w[j] -= lr * g[j] / (sqrtf(s[j]) + eps);
            }
        } else {
            float scale = rowwise_adagrad_scale(a, u, g);
            for (int64_t j = 0; j < dim; j++) w[j] -= scale * g[j];
        }
    }
}

/* update_range of half rows: each value read as float32, updated with the
 * same float32 arithmetic, and stored by round_half. Always inlined with a
 * constant dtype (update_bf16_range, update_f16_range), so each loop is
 * compiled for one type, without a branch per value (which made the loop 2x
 * slower). */
static inline __attribute__((always_inline)) void update_half(
        const struct update_args *a, int64_t start, int64_t end, const int dtype) {
    int64_t dim = a->dim, width = a->state_width;
    float lr = a->lr, eps = a->eps;
    uint32_t seed = a->seed;
    for (int64_t u = start; u < end; u++) {
        if (u + PREFETCH_AHEAD < end) {
            __builtin_prefetch((uint16_t *)a->weights + a->rows[u + PREFETCH_AHEAD] * dim,
                               1, 1);
            if (a->kind != 0)
                __builtin_prefetch(a->state + a->rows[u + PREFETCH_AHEAD] * width, 1, 1);
        }
        uint16_t *w = (uint16_t *)a->weights + a->rows[u] * dim;
        const float *g = a->grads + u * dim;
        if (a->kind == 0) {
            for (int64_t j = 0; j < dim; j++)
                w[j] = round_half(half_to_float(w[j], dtype) - lr * g[j], dtype, seed, j);
        } else if (a->kind == 1) {
            float *s = a->state + a->rows[u] * width;
            for (int64_t j = 0; j < dim; j++) {
                s[j] += g[j] * g[j];
                float value = half_to_float(w[j], dtype) - lr * g[j] / (sqrtf(s[j]) + eps);
                w[j] = round_half(value, dtype, seed, j);
            }
        } else {
            float scale = rowwise_adagrad_scale(a, u, g);
            for (int64_t j = 0; j < dim; j++)
                w[j] = round_half(half_to_float(w[j], dtype) - scale * g[j], dtype, seed, j);
        }
    }
}

/* The AVX2 clones multiply 8 hashes at once (SSE2 has no 32-bit multiply). */
VECTOR_CLONES
static void update_bf16_range(void *context, int64_t start, int64_t end) {
    update_half((const struct update_args *)context, start, end, ROWS_BF16);
}

VECTOR_CLONES
static void update_f16_range(void *context, int64_t start, int64_t end) {
    update_half((const struct update_args *)context, start, end, ROWS_F16);
}

/* Rows are distinct, so their updates split over threads freely. Returns 0,
 * or -1 (nothing updated) when a row lies outside [0, table_rows), the rows
 * of weights and state. */
int rk_apply_update(int kind, void *weights, int dtype, float *state, int64_t state_width,
                    int64_t dim, int64_t table_rows, const int64_t *rows,
                    const float *grads, int64_t num_rows, float lr, float eps,
                    uint32_t seed, int threads) {
    if (!all_in_range(rows, num_rows, table_rows)) return -1;
    struct update_args a = {kind, weights, state, state_width, dim, rows, grads, lr, eps,
                            dtype, seed};
    parallel_ranges(threads, num_rows, num_rows,
                    dtype == ROWS_F32 ? update_range
                    : dtype == ROWS_BF16 ? update_bf16_range : update_f16_range, &a);
    return 0;
}

/* Distinct rows in order of first appearance, and each id's position among
 * them (one thread: the order is the first appearance). ``position`` (one
 * entry per table row, num_rows of them) must hold -1 everywhere on entry;
 * it is restored to -1 before returning. It is int32 (n < 2^31): half the
 * cache lines of int64 for the random accesses into a table-sized array.
 * Returns the distinct count, or -1 when a row lies outside [0, num_rows)
 * (such rows are skipped). */
int64_t rk_unique_rows(const int64_t *rows, int64_t n, int64_t num_rows,
                       int32_t *position, int64_t *unique, int64_t *unique_index) {
    int64_t count = 0;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n) {
            int64_t ahead = rows[i + PREFETCH_AHEAD];
            if ((uint64_t)ahead < (uint64_t)num_rows) __builtin_prefetch(&position[ahead], 1, 1);
        }
        int64_t r = rows[i];
        if ((uint64_t)r >= (uint64_t)num_rows) { bad = 1; continue; }
        if (position[r] < 0) { position[r] = (int32_t)count; unique[count++] = r; }
        unique_index[i] = position[r];
    }
    for (int64_t u = 0; u < count; u++) position[unique[u]] = -1;
    return bad ? -1 : count;
}

/* ---- The layout of packed batches (ragged_layout.py) ---------------------- */

/* The threads worth using for a loop over n items (parallel_ranges' rule),
 * for the two-phase loops below that split [0, n) the same way twice. */
static int threads_for(int threads, int64_t n) {
    int64_t most = n / MIN_ITEMS_PER_THREAD;
    if (threads > most) threads = (int)most;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    return threads < 1 ? 1 : threads;
}

/* ids = the values[i] with present[i] != 0, in order; offsets[i] = how many
 * of them come before i (offsets[n]: all). Each thread counts its range,
 * then writes it from the count of the ranges before it. The write loop is
 * branch-free up to the range's last present entry: an absent entry's
 * write at ids[k] is overwritten by the next present one, which lies in the
 * same range, so no thread writes past its own part of ids. ids holds n
 * entries (the most there can be). Returns the count. No value is an index:
 * nothing to check. */
int64_t rk_compact_present(const int64_t *values, const uint8_t *present, int64_t n,
                           int64_t *ids, int64_t *offsets, int threads) {
    int t_count = threads_for(threads, n);
    int64_t start_of[MAX_THREADS + 1];
    start_of[0] = 0;
    #pragma omp parallel for num_threads(t_count) schedule(static, 1) if (t_count > 1)
    for (int t = 0; t < t_count; t++) {
        int64_t count = 0;
        for (int64_t i = n * t / t_count; i < n * (t + 1) / t_count; i++)
            count += present[i] != 0;
        start_of[t + 1] = count;
    }
    for (int t = 0; t < t_count; t++) start_of[t + 1] += start_of[t];
    #pragma omp parallel for num_threads(t_count) schedule(static, 1) if (t_count > 1)
    for (int t = 0; t < t_count; t++) {
        int64_t lo = n * t / t_count, hi = n * (t + 1) / t_count, last = hi;
        while (last > lo && !present[last - 1]) last--;
        int64_t k = start_of[t];
        for (int64_t i = lo; i < last; i++) {
            offsets[i] = k;
            ids[k] = values[i];
            k += present[i] != 0;
        }
        for (int64_t i = last; i < hi; i++) offsets[i] = k;
    }
    offsets[n] = start_of[t_count];
    return start_of[t_count];
}

/* bags[j] = k for offsets[k] <= j < offsets[k + 1]: the bag of every id.
 * The offsets are checked before anything is written (they address bags):
 * returns 0, or -1 unless they start at 0, never decrease and end at
 * num_ids. A thread owns a range of bags, whose ids lie in a range of their
 * own. */
struct bag_of_ids_args {
    const int64_t *offsets;
    int64_t *bags;
};

/* Up to the range's last non-empty bag every bag writes its first position
 * without a branch (bags of 0 or 1 ids, a batch with missing values, are
 * the common case): an empty bag's write is overwritten by the next
 * non-empty bag, which starts at the same position and lies in the range. */
static void bag_of_ids_range(void *context, int64_t start, int64_t end) {
    struct bag_of_ids_args *a = (struct bag_of_ids_args *)context;
    const int64_t *offsets = a->offsets;
    int64_t last = end;
    while (last > start && offsets[last] == offsets[last - 1]) last--;
    for (int64_t k = start; k < last; k++) {
        a->bags[offsets[k]] = k;
        for (int64_t j = offsets[k] + 1; j < offsets[k + 1]; j++) a->bags[j] = k;
    }
}

int rk_bag_of_ids(const int64_t *offsets, int64_t num_bags, int64_t num_ids,
                  int64_t *bags, int threads) {
    int bad = offsets[0] != 0 || offsets[num_bags] != num_ids;
    for (int64_t k = 0; k < num_bags; k++) bad |= offsets[k + 1] < offsets[k];
    if (bad) return -1;
    struct bag_of_ids_args a = {offsets, bags};
    parallel_ranges(threads, num_bags, num_bags + num_ids, bag_of_ids_range, &a);
    return 0;
}
