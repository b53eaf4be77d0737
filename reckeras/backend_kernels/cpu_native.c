/* CPU kernels of reckeras's sparse front end (see cpu_native.py).
 *
 * Plain C99 over raw pointers, compiled once per machine and called through
 * ctypes. Each function is the serial loop that the vectorized torch
 * reference expresses with whole-tensor ops; they agree exactly except for
 * the order of floating-point sums (tests compare with a tolerance).
 */
#include <stdint.h>
#include <string.h>
#include <math.h>

#define EMPTY INT64_MIN

static inline uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* keys = mix64(ids) ^ salt of each id's slot; slot s holds the next
 * slot_counts[s] ids (the packed batch is slot-major). */
void rk_table_keys(const int64_t *ids, const int64_t *salt, const int64_t *slot_counts,
                   int64_t num_slots, int64_t *keys) {
    int64_t i = 0;
    for (int64_t s = 0; s < num_slots; s++) {
        uint64_t salt_bits = (uint64_t)salt[s];
        for (int64_t end = i + slot_counts[s]; i < end; i++)
            keys[i] = (int64_t)(mix64((uint64_t)ids[i]) ^ salt_bits);
    }
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
 * several misses in flight instead of waiting on each in turn. */
#define PREFETCH_AHEAD 16

/* Linear-probing find-or-insert. New keys get rows num_rows, num_rows+1, ...
 * in order of first appearance. Returns the new row count. With
 * insert == 0 absent keys resolve to -1 and nothing changes. */
int64_t rk_find_or_insert(int64_t *slot_keys, int64_t *slot_rows, int64_t capacity,
                          const int64_t *keys, int64_t n, int64_t *rows,
                          int64_t num_rows, int insert) {
    uint64_t mask = (uint64_t)capacity - 1;
    int shift = home_shift(capacity);
    for (int64_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n) {
            uint64_t ahead = home_slot(keys[i + PREFETCH_AHEAD], shift);
            __builtin_prefetch(&slot_keys[ahead], 0, 1);
            __builtin_prefetch(&slot_rows[ahead], 0, 1);
        }
        int64_t key = keys[i] == EMPTY ? EMPTY + 1 : keys[i];
        uint64_t slot = home_slot(key, shift);
        for (;;) {
            int64_t seen = slot_keys[slot];
            if (seen == key) { rows[i] = slot_rows[slot]; break; }
            if (seen == EMPTY) {
                if (insert) {
                    slot_keys[slot] = key;
                    slot_rows[slot] = num_rows;
                    rows[i] = num_rows++;
                } else {
                    rows[i] = -1;
                }
                break;
            }
            slot = (slot + 1) & mask;
        }
    }
    return num_rows;
}

/* out[destination[i]] += weights[rows[unique_index[i]]] * id_weight[i]. */
void rk_pool_forward(const float *weights, int64_t dim, const int64_t *unique_rows,
                     const int64_t *unique_index, const int64_t *destination,
                     const float *id_weight, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n)
            __builtin_prefetch(weights + unique_rows[unique_index[i + PREFETCH_AHEAD]] * dim,
                               0, 1);
        const float *row = weights + unique_rows[unique_index[i]] * dim;
        float *target = out + destination[i] * dim;
        float w = id_weight[i];
        for (int64_t j = 0; j < dim; j++) target[j] += row[j] * w;
    }
}

/* grads[unique_index[i]] += grad_out[destination[i]] * id_weight[i]. */
void rk_aggregate(const float *grad_out, int64_t dim, const int64_t *unique_index,
                  const int64_t *destination, const float *id_weight, int64_t n,
                  float *grads) {
    for (int64_t i = 0; i < n; i++) {
        const float *source = grad_out + destination[i] * dim;
        float *target = grads + unique_index[i] * dim;
        float w = id_weight[i];
        for (int64_t j = 0; j < dim; j++) target[j] += source[j] * w;
    }
}

/* kind 0 SGD, 1 Adagrad (state: dim per row), 2 row-wise Adagrad (1 per row). */
void rk_apply_update(int kind, float *weights, float *state, int64_t state_width,
                     int64_t dim, const int64_t *rows, const float *grads,
                     int64_t num_rows, float lr, float eps) {
    for (int64_t u = 0; u < num_rows; u++) {
        if (u + PREFETCH_AHEAD < num_rows) {
            __builtin_prefetch(weights + rows[u + PREFETCH_AHEAD] * dim, 1, 1);
            if (kind != 0)
                __builtin_prefetch(state + rows[u + PREFETCH_AHEAD] * state_width, 1, 1);
        }
        float *w = weights + rows[u] * dim;
        const float *g = grads + u * dim;
        if (kind == 0) {
            for (int64_t j = 0; j < dim; j++) w[j] -= lr * g[j];
        } else if (kind == 1) {
            float *s = state + rows[u] * state_width;
            for (int64_t j = 0; j < dim; j++) {
                s[j] += g[j] * g[j];
                w[j] -= lr * g[j] / (sqrtf(s[j]) + eps);
            }
        } else {
            float *s = state + rows[u] * state_width;
            float square = 0.0f;
            for (int64_t j = 0; j < dim; j++) square += g[j] * g[j];
            s[0] += square / (float)dim;
            float scale = lr / (sqrtf(s[0]) + eps);
            for (int64_t j = 0; j < dim; j++) w[j] -= scale * g[j];
        }
    }
}

/* Distinct rows in order of first appearance, and each id's position among
 * them. ``position`` (one entry per table row) must hold -1 everywhere on
 * entry; it is restored to -1 before returning. Returns the distinct count. */
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
