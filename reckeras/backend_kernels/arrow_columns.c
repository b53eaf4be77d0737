/* The Arrow columns of a batch -> a column-major matrix, in one pass per
 * block of columns (see arrow_columns.py; built into one library with
 * cpu_native.c by native_build.py).
 *
 * The batch arrives through the Arrow C data interface (a record batch
 * exported as a struct array and its schema: pyarrow's
 * `__arrow_c_array__`), so no Python touches a column: each listed child's
 * values buffer is converted into its matrix column, a null is filled (id 0,
 * NaN for numbers), and for ids the validity bitmap becomes the column's
 * 0/1 lengths (the LENGTHS matrix the plan reads). A pyarrow loop over the
 * 300 columns of a `wide` batch with nulls cost ~2.3 ms over the null-free
 * one (copying each values buffer, unpacking each bitmap).
 *
 * Memory safety: every child's type (its format string), buffer count,
 * buffers and length are checked here against what the loop reads before
 * anything is written; a bad child is reported (the wrapper raises naming
 * it) and nothing is written. The sizes of the outputs are the wrapper's
 * (arrow_columns.py checks them against the arrays it passes). The columns
 * are split over threads: each thread owns whole columns of the outputs.
 */
#include <stdint.h>
#include <string.h>
#include <math.h>

/* The Arrow C data interface's structs, as its specification defines them. */
struct ArrowSchema {
    const char *format, *name, *metadata;
    int64_t flags, n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

/* The value types a column may have (its format string). */
enum { COLUMN_INT64, COLUMN_INT32, COLUMN_FLOAT32, COLUMN_FLOAT64, COLUMN_BAD };

static int column_type(const char *format) {
    if (format == NULL || format[0] == '\0' || format[1] != '\0') return COLUMN_BAD;
    switch (format[0]) {
        case 'l': return COLUMN_INT64;
        case 'i': return COLUMN_INT32;
        case 'f': return COLUMN_FLOAT32;
        case 'g': return COLUMN_FLOAT64;
        default: return COLUMN_BAD;
    }
}

static inline int bit_at(const uint8_t *bits, int64_t k) { return (bits[k >> 3] >> (k & 7)) & 1; }

/* Whether a column holds a null in its rows [first, first + rows): its
 * null count where the array knows it, else (-1, as a slice may export)
 * its validity bitmap's bits. */
static int has_null(const struct ArrowArray *column, int64_t first, int64_t rows) {
    if (column->buffers[0] == NULL || column->null_count == 0) return 0;
    if (column->null_count > 0) return 1;
    const uint8_t *bits = column->buffers[0];
    for (int64_t i = 0; i < rows; i++)
        if (!bit_at(bits, first + i)) return 1;
    return 0;
}

static inline double value_at(const void *values, int type, int64_t k) {
    switch (type) {
        case COLUMN_INT64: return (double)((const int64_t *)values)[k];
        case COLUMN_INT32: return ((const int32_t *)values)[k];
        case COLUMN_FLOAT32: return ((const float *)values)[k];
        default: return ((const double *)values)[k];
    }
}

/* One column of ids: values (id 0 at a null) and, where `lengths` is given,
 * its 0/1 lengths. The bitmap is read a byte (8 rows) at a time from the
 * first row whose bit starts a byte: the 8 rows' loop vectorizes. */
#define ID_ROWS(T, LENGTHS)                                                             \
    do {                                                                                \
        const T *v = (const T *)values + first;                                         \
        int64_t i = 0;                                                                  \
        for (; i < rows && ((first + i) & 7); i++) {                                    \
            int present = bit_at(validity, first + i);                                  \
            out[i] = (int64_t)v[i] & -(int64_t)present;                                 \
            if (LENGTHS) lengths[i] = present;                                          \
        }                                                                               \
        for (; i + 8 <= rows; i += 8) {                                                 \
            uint8_t byte = validity[(first + i) >> 3];                                  \
            for (int b = 0; b < 8; b++) {                                               \
                int present = (byte >> b) & 1;                                          \
                out[i + b] = (int64_t)v[i + b] & -(int64_t)present;                     \
                if (LENGTHS) lengths[i + b] = present;                                  \
            }                                                                           \
        }                                                                               \
        for (; i < rows; i++) {                                                         \
            int present = bit_at(validity, first + i);                                  \
            out[i] = (int64_t)v[i] & -(int64_t)present;                                 \
            if (LENGTHS) lengths[i] = present;                                          \
        }                                                                               \
    } while (0)

static void id_column(const void *values, const uint8_t *validity, int type, int64_t first,
                      int64_t rows, int64_t *out, int32_t *lengths) {
    if (validity == NULL) {
        if (type == COLUMN_INT64) memcpy(out, (const int64_t *)values + first, rows * 8);
        else for (int64_t i = 0; i < rows; i++) out[i] = ((const int32_t *)values)[first + i];
        if (lengths) for (int64_t i = 0; i < rows; i++) lengths[i] = 1;
        return;
    }
    if (type == COLUMN_INT64 && lengths) ID_ROWS(int64_t, 1);
    else if (type == COLUMN_INT64) ID_ROWS(int64_t, 0);
    else if (lengths) ID_ROWS(int32_t, 1);
    else ID_ROWS(int32_t, 0);
}

/* One column of numbers: float32 values, NaN at a null; returns whether a
 * value is +-inf (after the conversion to float32, as pyarrow's cast). */
static int number_column(const void *values, const uint8_t *validity, int type, int64_t first,
                         int64_t rows, float *out) {
    int infinite = 0;
    if (validity == NULL && type == COLUMN_FLOAT32) {
        memcpy(out, (const float *)values + first, rows * 4);
        for (int64_t i = 0; i < rows; i++) infinite |= isinf(out[i]) != 0;
        return infinite;
    }
    for (int64_t i = 0; i < rows; i++) {
        float x = (float)value_at(values, type, first + i);
        if (validity != NULL && !bit_at(validity, first + i)) x = NAN;
        out[i] = x;
        infinite |= isinf(x) != 0;
    }
    return infinite;
}

/* Columns `positions[j]` of the batch -> column j of `matrix` (`rows` x
 * `width`, column-major; int64 ids, or float32 numbers when `numbers`).
 * Ids: with `lengths` given and a null in some listed column, column
 * `lengths_columns[j]` of `lengths` (int32, column-major, `rows` a column)
 * gets each row's 0/1 length (1 in a column without nulls); without a null
 * it is not written.
 *
 * report[0]: the listed columns holding a null; report[1]: the first that
 * holds +-inf (numbers), else -1.
 *
 * Returns -1, or the j of the first listed column the kernel cannot read
 * (not a column of the batch, a type other than int64, int32, float32 or
 * float64 -- int64/int32 for ids --, a missing buffer, fewer values than
 * rows); nothing is written then. */
int64_t rk_arrow_block(const struct ArrowSchema *schema, const struct ArrowArray *batch,
                       const int64_t *positions, int64_t width, int numbers, void *matrix,
                       int32_t *lengths, const int64_t *lengths_columns, int64_t *report,
                       int threads) {
    int64_t rows = batch->length, nulls = 0;
    if (schema->n_children != batch->n_children) return 0;
    for (int64_t j = 0; j < width; j++) {
        int64_t p = positions[j];
        if (p < 0 || p >= batch->n_children) return j;
        const struct ArrowArray *column = batch->children[p];
        int type = column_type(schema->children[p]->format);
        if (type == COLUMN_BAD || (!numbers && type != COLUMN_INT64 && type != COLUMN_INT32))
            return j;
        if (column->n_buffers != 2 || column->buffers[1] == NULL || column->offset < 0
            || column->length < batch->offset + rows)
            return j;
        nulls += has_null(column, batch->offset + column->offset, rows);
    }
    report[0] = nulls;
    report[1] = -1;
    int32_t *written = nulls ? lengths : NULL;
    int64_t infinite = width;
    int t_count = threads < 1 ? 1 : threads;
    if ((int64_t)t_count > width) t_count = (int)(width > 0 ? width : 1);
    #pragma omp parallel for num_threads(t_count) schedule(static) reduction(min:infinite) \
        if (t_count > 1 && rows * width >= 65536)
    for (int64_t j = 0; j < width; j++) {
        const struct ArrowArray *column = batch->children[positions[j]];
        int type = column_type(schema->children[positions[j]]->format);
        const uint8_t *validity = column->null_count != 0 ? column->buffers[0] : NULL;
        int64_t first = batch->offset + column->offset;
        if (numbers) {
            if (number_column(column->buffers[1], validity, type, first, rows,
                              (float *)matrix + j * rows) && j < infinite)
                infinite = j;
        } else {
            id_column(column->buffers[1], validity, type, first, rows,
                      (int64_t *)matrix + j * rows,
                      written ? written + lengths_columns[j] * rows : NULL);
        }
    }
    if (infinite < width) report[1] = infinite;
    return -1;
}
