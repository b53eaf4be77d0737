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
 */
#include <stdint.h>
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

void rk_table_keys(const int64_t *ids, const int64_t *salt, const int64_t *slot_counts,
                   int64_t num_slots, int64_t *keys, int threads) {
    int64_t n = 0;
    for (int64_t s = 0; s < num_slots; s++) n += slot_counts[s];
    struct table_keys_args a = {ids, salt, slot_counts, num_slots, keys};
    parallel_ranges(threads, n, n, table_keys_range, &a);
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

/* How many keys ahead the probe loop prefetches their home slots. A probe is
 * a cache miss into a table much larger than the caches; prefetching keeps
 * several misses in flight instead of waiting on each in turn. The other
 * loops prefetch the rows they will gather the same way. */
#define PREFETCH_AHEAD 16

struct probe_args {
    int64_t *slot_keys, *slot_rows;
    uint64_t mask;
    int shift;
    const int64_t *keys;
    int64_t *rows;
    int64_t num_rows;
    int insert;
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
        for (;;) {
            int64_t seen = a->slot_keys[slot];
            if (seen == key) { a->rows[i] = a->slot_rows[slot]; break; }
            if (seen == EMPTY) {
                if (a->insert) {
                    a->slot_keys[slot] = key;
                    a->slot_rows[slot] = a->num_rows;
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

/* Linear-probing find-or-insert. New keys get rows num_rows, num_rows+1, ...
 * in order of first appearance, so inserting stays on one thread; a pure
 * find (insert == 0: absent keys resolve to -1, nothing changes) is split
 * over ``threads``. Returns the new row count. */
int64_t rk_find_or_insert(int64_t *slot_keys, int64_t *slot_rows, int64_t capacity,
                          const int64_t *keys, int64_t n, int64_t *rows,
                          int64_t num_rows, int insert, int threads) {
    struct probe_args a = {slot_keys, slot_rows, (uint64_t)capacity - 1,
                           home_shift(capacity), keys, rows, num_rows, insert};
    parallel_ranges(insert ? 1 : threads, n, n, probe_range, &a);
    return a.num_rows;
}

/* The loops below split their *outputs*: a thread owns the targets in
 * [lo, hi) of the output rows, reads every input and keeps the items that
 * write there, in input order. No two threads write one row and each row's
 * sum is taken in input order, as on one thread. */
struct scatter_args {
    const float *source;            /* rows gathered, [., dim] */
    int64_t dim;
    const int64_t *source_row;      /* NULL: source index is through_rows[through_index[i]] */
    const int64_t *through_rows, *through_index;
    const int64_t *target_row;
    const float *scale;
    int64_t n, num_targets;
    float *out;
};

static inline int64_t gather_row(const struct scatter_args *a, int64_t i) {
    return a->source_row ? a->source_row[i] : a->through_rows[a->through_index[i]];
}

static void scatter_range(void *context, int64_t lo, int64_t hi) {
    const struct scatter_args *a = (const struct scatter_args *)context;
    int64_t dim = a->dim;
    int everything = lo == 0 && hi == a->num_targets;
    for (int64_t i = 0; i < a->n; i++) {
        int64_t target = a->target_row[i];
        if (!everything && (target < lo || target >= hi)) continue;
        if (i + PREFETCH_AHEAD < a->n)
            __builtin_prefetch(a->source + gather_row(a, i + PREFETCH_AHEAD) * dim, 0, 1);
        const float *row = a->source + gather_row(a, i) * dim;
        float *out = a->out + target * dim;
        float w = a->scale[i];
        for (int64_t j = 0; j < dim; j++) out[j] += row[j] * w;
    }
}

/* out[destination[i]] += weights[rows[unique_index[i]]] * id_weight[i]. */
void rk_pool_forward(const float *weights, int64_t dim, const int64_t *unique_rows,
                     const int64_t *unique_index, const int64_t *destination,
                     const float *id_weight, int64_t n, float *out, int64_t num_slots,
                     int threads) {
    struct scatter_args a = {weights, dim, NULL, unique_rows, unique_index, destination,
                             id_weight, n, num_slots, out};
    parallel_ranges(threads, num_slots, n, scatter_range, &a);
}

/* grads[unique_index[i]] += grad_out[destination[i]] * id_weight[i]. */
void rk_aggregate(const float *grad_out, int64_t dim, const int64_t *unique_index,
                  const int64_t *destination, const float *id_weight, int64_t n,
                  float *grads, int64_t num_unique, int threads) {
    struct scatter_args a = {grad_out, dim, destination, NULL, NULL, unique_index,
                             id_weight, n, num_unique, grads};
    parallel_ranges(threads, num_unique, n, scatter_range, &a);
}

/* kind 0 SGD, 1 Adagrad (state: dim per row), 2 row-wise Adagrad (1 per row). */
struct update_args {
    int kind;
    float *weights, *state;
    int64_t state_width, dim;
    const int64_t *rows;
    const float *grads;
    float lr, eps;
};

static void update_range(void *context, int64_t start, int64_t end) {
    const struct update_args *a = (const struct update_args *)context;
    int64_t dim = a->dim, width = a->state_width;
    float lr = a->lr, eps = a->eps;
    for (int64_t u = start; u < end; u++) {
        if (u + PREFETCH_AHEAD < end) {
            __builtin_prefetch(a->weights + a->rows[u + PREFETCH_AHEAD] * dim, 1, 1);
            if (a->kind != 0)
                __builtin_prefetch(a->state + a->rows[u + PREFETCH_AHEAD] * width, 1, 1);
        }
        float *w = a->weights + a->rows[u] * dim;
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
            float *s = a->state + a->rows[u] * width;
            float square = 0.0f;
            for (int64_t j = 0; j < dim; j++) square += g[j] * g[j];
            s[0] += square / (float)dim;
            float scale = lr / (sqrtf(s[0]) + eps);
            for (int64_t j = 0; j < dim; j++) w[j] -= scale * g[j];
        }
    }
}

/* Rows are distinct, so their updates split over threads freely. */
void rk_apply_update(int kind, float *weights, float *state, int64_t state_width,
                     int64_t dim, const int64_t *rows, const float *grads,
                     int64_t num_rows, float lr, float eps, int threads) {
    struct update_args a = {kind, weights, state, state_width, dim, rows, grads, lr, eps};
    parallel_ranges(threads, num_rows, num_rows, update_range, &a);
}

/* Distinct rows in order of first appearance, and each id's position among
 * them (one thread: the order is the first appearance). ``position`` (one
 * entry per table row) must hold -1 everywhere on entry; it is restored to
 * -1 before returning. Returns the distinct count. */
int64_t rk_unique_rows(const int64_t *rows, int64_t n, int64_t *position,
                       int64_t *unique, int64_t *unique_index) {
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n) __builtin_prefetch(&position[rows[i + PREFETCH_AHEAD]], 1, 1);
        int64_t r = rows[i];
        if (position[r] < 0) { position[r] = count; unique[count++] = r; }
        unique_index[i] = position[r];
    }
    for (int64_t u = 0; u < count; u++) position[unique[u]] = -1;
    return count;
}
