/* Machine micro-benchmarks: fp32 FMA peak, FMA chains (latency and the accumulators that
 * reach the peak), read bandwidth from any level of the memory hierarchy, the peaks of
 * the bf16 and 8-bit integer dot products the low-precision GEMMs run, and the rates of
 * their weights' dequantization sequences.
 *
 * Built at run time by sandwich.tuner.machine_bench with -mavx512f (plus -mavx512bw,
 * -mavx512vnni, -mavx512bf16 and -mamx-tile -mamx-bf16 where the CPU has them) or
 * -mavx2 -mfma and loaded with
 * ctypes. Each entry point runs `threads` workers (the caller is worker 0)
 * and returns 0 on success; the Python side does the timing, so that warm-up, repeats
 * and the median follow the project's one timing helper.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stddef.h>

#if defined(__AVX512F__)
typedef __m512 vec;
#define LANES 16
#define VSET1(x) _mm512_set1_ps(x)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VLOAD(p) _mm512_load_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 vec;
#define LANES 8
#define VSET1(x) _mm256_set1_ps(x)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VLOAD(p) _mm256_load_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#else
#error "machine_bench.c needs AVX-512F or AVX2+FMA"
#endif

/* Independent FMA chains: enough to cover latency x throughput (4 x 2) on every x86 core
 * we target, while leaving registers for the two constants (AVX2 has 16). */
#define FMA_ACCS 12
/* Independent read accumulators: a single dependent chain reads far below the limit. */
#define READ_ACCS 8
#define MAX_THREADS 1024

#define MAX_CHAINS 16

int mb_lanes(void) { return LANES; }
int mb_max_chains(void) { return MAX_CHAINS; }
int mb_fma_accs(void) { return FMA_ACCS; }
int mb_read_block(void) { return READ_ACCS * LANES; }

static float hsum(vec v) {
    float t[LANES];
    VSTORE(t, v);
    float s = 0.0f;
    for (int i = 0; i < LANES; i++) s += t[i];
    return s;
}

/* One thread, N independent FMA chains: with one chain each FMA waits for the last (its
 * latency); the rate stops growing at latency x throughput chains. The array is unrolled
 * into registers (no loads or stores in the loop); acc = acc * m + c converges to
 * c / (1 - m): no overflow, no denormals. */
#define CHAIN_FN(N)                                                              \
    static float chains_##N(long iters) {                                        \
        const vec m = VSET1(0.999999f), c = VSET1(1e-3f);                        \
        vec a[N];                                                                \
        _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) a[j] = VSET1(0.05f * j); \
        for (long i = 0; i < iters; i++) {                                       \
            _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) a[j] = VFMA(a[j], m, c); \
        }                                                                        \
        vec s = a[0];                                                            \
        _Pragma("GCC unroll 16") for (int j = 1; j < N; j++) s = VADD(s, a[j]); \
        return hsum(s);                                                          \
    }
CHAIN_FN(1) CHAIN_FN(2) CHAIN_FN(3) CHAIN_FN(4) CHAIN_FN(5) CHAIN_FN(6) CHAIN_FN(7) CHAIN_FN(8)
CHAIN_FN(9) CHAIN_FN(10) CHAIN_FN(11) CHAIN_FN(12) CHAIN_FN(13) CHAIN_FN(14) CHAIN_FN(15)
CHAIN_FN(16)

typedef struct {
    long iters;
    float result;
} fma_job;

static void *fma_worker(void *p) {
    fma_job *job = (fma_job *)p;
    job->result = chains_12(job->iters); /* FMA_ACCS independent chains */
    return NULL;
}

typedef struct {
    const float *p;
    size_t n; /* a multiple of READ_ACCS * LANES * streams */
    int passes;
    int streams; /* the chunk is read as this many equal parts, in lock step */
    float result;
} read_job;

/* One core keeps more loads in flight when it reads several address streams at once
 * (a GEMV over several weight panels does): the limit is the best over stream counts. */
static void *read_worker(void *p) {
    read_job *job = (read_job *)p;
    vec a0 = VSET1(0.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    size_t part = job->n / job->streams;
    for (int pass = 0; pass < job->passes; pass++) {
        for (size_t i = 0; i < part; i += READ_ACCS * LANES) {
            for (int st = 0; st < job->streams; st++) {
                const float *x = job->p + st * part + i;
                a0 = VADD(a0, VLOAD(x + 0 * LANES));
                a1 = VADD(a1, VLOAD(x + 1 * LANES));
                a2 = VADD(a2, VLOAD(x + 2 * LANES));
                a3 = VADD(a3, VLOAD(x + 3 * LANES));
                a4 = VADD(a4, VLOAD(x + 4 * LANES));
                a5 = VADD(a5, VLOAD(x + 5 * LANES));
                a6 = VADD(a6, VLOAD(x + 6 * LANES));
                a7 = VADD(a7, VLOAD(x + 7 * LANES));
            }
        }
    }
    vec s = VADD(VADD(VADD(a0, a1), VADD(a2, a3)), VADD(VADD(a4, a5), VADD(a6, a7)));
    job->result = hsum(s);
    return NULL;
}

/* `iters` loop trips of `chains` dependent-per-chain vector FMAs on the calling thread. */
int mb_fma_chains(int chains, long iters, float *out) {
    static float (*const fns[MAX_CHAINS])(long) = {
        chains_1, chains_2, chains_3, chains_4, chains_5, chains_6, chains_7, chains_8,
        chains_9, chains_10, chains_11, chains_12, chains_13, chains_14, chains_15, chains_16};
    if (chains < 1 || chains > MAX_CHAINS || iters < 1) return -1;
    *out = fns[chains - 1](iters);
    return 0;
}

/* Run worker(jobs[t]) on `threads` threads, the caller being thread 0. */
static int run_threads(int threads, void *(*worker)(void *), void *jobs, size_t job_size) {
    pthread_t tid[MAX_THREADS];
    int started = 0, rc = 0;
    for (int t = 1; t < threads; t++) {
        if (pthread_create(&tid[t], NULL, worker, (char *)jobs + t * job_size) != 0) {
            rc = -2;
            break;
        }
        started = t;
    }
    worker(jobs);
    for (int t = 1; t <= started; t++) pthread_join(tid[t], NULL);
    return rc;
}

/* `iters` loop trips of `worker` per thread; sum of the threads' results to *out. */
static int run_iters(int threads, long iters, void *(*worker)(void *), float *out) {
    if (threads < 1 || threads > MAX_THREADS || iters < 1) return -1;
    fma_job jobs[MAX_THREADS];
    for (int t = 0; t < threads; t++) jobs[t].iters = iters;
    int rc = run_threads(threads, worker, jobs, sizeof(fma_job));
    float s = 0.0f;
    for (int t = 0; t < threads; t++) s += jobs[t].result;
    *out = s;
    return rc;
}

/* `iters` loop trips of FMA_ACCS vector FMAs per thread; sum of results to *out. */
int mb_fma(int threads, long iters, float *out) { return run_iters(threads, iters, fma_worker, out); }

/* Read buf[0:n) `passes` times, split into contiguous per-thread chunks, each read as
 * `streams` concurrent streams. buf must be 64-byte aligned and n a multiple of
 * mb_read_block() * threads * streams. */
int mb_read(int threads, const float *buf, size_t n, int passes, int streams, float *out) {
    size_t block = (size_t)READ_ACCS * LANES;
    if (threads < 1 || threads > MAX_THREADS || passes < 1 || streams < 1) return -1;
    if (((size_t)buf & 63) != 0 || n % (block * threads * streams) != 0) return -1;
    read_job jobs[MAX_THREADS];
    size_t chunk = n / threads;
    for (int t = 0; t < threads; t++) {
        jobs[t].p = buf + t * chunk;
        jobs[t].n = chunk;
        jobs[t].passes = passes;
        jobs[t].streams = streams;
    }
    int rc = run_threads(threads, read_worker, jobs, sizeof(read_job));
    float s = 0.0f;
    for (int t = 0; t < threads; t++) s += jobs[t].result;
    *out = s;
    return rc;
}

/* A GEMM's register tile fed from L1: TILE_ROWS rows x TILE_VECS vectors of accumulators, per
 * step one row of TILE_VECS weight vectors loaded and one broadcast of A per row, as the
 * family's inner loop runs (dsl/kernels/gemm_family.sw), over TILE_KROWS weight rows that
 * stay in L1 (16 KB on AVX-512) and rows of A TILE_LDA floats apart. No cache misses and no
 * loop around it: how close a GEMM can come to the FMA peak on this core, which on some
 * (a Sapphire Rapids VM: 85-90% of it) is well below a loop of FMAs on registers alone. */
#if LANES == 16
#define TILE_ROWS 6
#define TILE_VECS 4
#else
#define TILE_ROWS 4
#define TILE_VECS 3
#endif
#define TILE_KROWS 64
#define TILE_LDA 264

int mb_tile_flops(void) { return 2 * TILE_ROWS * TILE_VECS * LANES * TILE_KROWS; }

static void *tile_worker(void *p) {
    fma_job *job = (fma_job *)p;
    float w[TILE_KROWS * TILE_VECS * LANES] __attribute__((aligned(64)));  /* 16 KB on AVX-512 */
    float a[TILE_ROWS * TILE_LDA] __attribute__((aligned(64)));
    for (int i = 0; i < TILE_KROWS * TILE_VECS * LANES; i++) w[i] = 1e-3f;
    for (int i = 0; i < TILE_ROWS * TILE_LDA; i++) a[i] = 1e-3f;
    vec c[TILE_ROWS][TILE_VECS];
    _Pragma("GCC unroll 8") for (int i = 0; i < TILE_ROWS; i++)
        _Pragma("GCC unroll 8") for (int j = 0; j < TILE_VECS; j++) c[i][j] = VSET1(0.0f);
    for (long it = 0; it < job->iters; it++) {
        const float *wk = w, *ak = a;
        for (int k = 0; k < TILE_KROWS; k++, wk += TILE_VECS * LANES, ak++) {
            vec wv[TILE_VECS];
            _Pragma("GCC unroll 8") for (int j = 0; j < TILE_VECS; j++) wv[j] = VLOAD(wk + j * LANES);
            _Pragma("GCC unroll 8") for (int i = 0; i < TILE_ROWS; i++) {
                vec b = VSET1(ak[i * TILE_LDA]);
                _Pragma("GCC unroll 8") for (int j = 0; j < TILE_VECS; j++) c[i][j] = VFMA(b, wv[j], c[i][j]);
            }
        }
    }
    vec s = VSET1(0.0f);
    for (int i = 0; i < TILE_ROWS; i++)
        for (int j = 0; j < TILE_VECS; j++) s = VADD(s, c[i][j]);
    job->result = hsum(s);
    return NULL;
}

/* `iters` passes of the tile over its TILE_KROWS weight rows per thread (mb_tile_flops() each). */
int mb_tile(int threads, long iters, float *out) { return run_iters(threads, iters, tile_worker, out); }

/* bf16 dot products (vdpbf16ps, avx512_bf16): FMA_ACCS independent chains per thread, each
 * instruction adding 16 lanes x 2 bf16 products; -1 where the build has no avx512_bf16.
 * The operands are small constants, so each chain grows linearly and stays finite. */
#if defined(__AVX512BF16__)
static void *dpbf16_worker(void *p) {
    fma_job *job = (fma_job *)p;
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3A833A83); /* two bf16 of about 1e-3 */
    __m512 a[FMA_ACCS];
    for (int j = 0; j < FMA_ACCS; j++) a[j] = _mm512_set1_ps(0.0f);
    for (long i = 0; i < job->iters; i++) {
        _Pragma("GCC unroll 16") for (int j = 0; j < FMA_ACCS; j++) a[j] = _mm512_dpbf16_ps(a[j], x, x);
    }
    __m512 s = a[0];
    for (int j = 1; j < FMA_ACCS; j++) s = _mm512_add_ps(s, a[j]);
    job->result = _mm512_reduce_add_ps(s);
    return NULL;
}
#endif

int mb_dpbf16(int threads, long iters, float *out) {
#if defined(__AVX512BF16__)
    return run_iters(threads, iters, dpbf16_worker, out);
#else
    (void)threads; (void)iters; (void)out;
    return -1;
#endif
}

/* AMX tile products (tdpbf16ps, AMX-BF16): per thread, 4 accumulator tiles of 16 x 16 f32,
 * each instruction 16 x 16 x 32 bf16 products, on A and B tiles loaded once: the matrix
 * unit's rate with no memory traffic (a GEMM's tile loads come on top of it). The process
 * must hold the tile state (compiler/amx.py, request_tiles) before it runs; -1 where the
 * build has no AMX-BF16. The tiles hold bf16 values of about 1e-3, so the sums stay finite. */
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define AMX_ACCS 4
typedef struct {
    unsigned char palette, start_row, reserved[14];
    unsigned short colsb[16];
    unsigned char rows[16];
} tile_config;

static void *amx_worker(void *p) {
    fma_job *job = (fma_job *)p;
    tile_config cfg = {0};
    unsigned short ab[16 * 32] __attribute__((aligned(64)));
    float c[16 * 16] __attribute__((aligned(64)));
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    for (int i = 0; i < 16 * 32; i++) ab[i] = 0x3A83;
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ab, 64);
    _tile_loadd(5, ab, 64);
    _tile_loadd(6, ab, 64);
    _tile_loadd(7, ab, 64);
    for (long i = 0; i < job->iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(3, c, 64);
    _tile_release();
    job->result = c[0];
    return NULL;
}
int mb_amx_accs(void) { return AMX_ACCS; }
#else
int mb_amx_accs(void) { return 0; }
#endif

int mb_amx_bf16(int threads, long iters, float *out) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    return run_iters(threads, iters, amx_worker, out);
#else
    (void)threads; (void)iters; (void)out;
    return -1;
#endif
}

/* The int formats' dot8: per 32-bit lane, 4 products of an unsigned weight byte and a signed
 * activation byte added to the lane, no saturation. vpdpbusd where the build has AVX512-VNNI;
 * else the bytes split into two 16-bit pairs and 2 pmaddwd + 2 paddd (AVX-512BW, or AVX2 on an
 * AVX2 build). INT8_ACCS independent chains per thread. -1 on an AVX-512 build without
 * AVX-512BW. */
#if defined(__AVX512F__) && (defined(__AVX512VNNI__) || defined(__AVX512BW__))
#define INT8_LANES 16
#define INT8_ACCS FMA_ACCS
typedef __m512i ivec;
#define ISET1(x) _mm512_set1_epi32(x)
#define IADD(a, b) _mm512_add_epi32(a, b)
#define IAND(a, b) _mm512_and_si512(a, b)
#define ISHR32(a, n) _mm512_srli_epi32(a, n)
#define IMADD(a, b) _mm512_madd_epi16(a, b)
#define ISTORE(p, v) _mm512_storeu_si512((void *)(p), v)
#elif !defined(__AVX512F__)
#define INT8_LANES 8
/* 16 registers, and gcc gives each chain two (a copy per dot8): 8 chains already spill. A chain
 * waits for one paddd a dot8 (the pmaddwd are off it), so 4 reach the peak (Zen 4: as 8). */
#define INT8_ACCS 4
typedef __m256i ivec;
#define ISET1(x) _mm256_set1_epi32(x)
#define IADD(a, b) _mm256_add_epi32(a, b)
#define IAND(a, b) _mm256_and_si256(a, b)
#define ISHR32(a, n) _mm256_srli_epi32(a, n)
#define IMADD(a, b) _mm256_madd_epi16(a, b)
#define ISTORE(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#endif

int mb_int8_lanes(void) {
#if defined(INT8_LANES)
    return INT8_LANES;
#else
    return 0;
#endif
}

int mb_int8_accs(void) {
#if defined(INT8_LANES)
    return INT8_ACCS;
#else
    return 0;
#endif
}

#if defined(INT8_LANES)
/* Weight bytes 128, 1, 1, 1 (unsigned) times activation bytes -1, 127, 1, 1 (signed): each
 * dot8 adds exactly 1 a lane, a sum that any other signedness of either operand, or a lost
 * pair, changes; no overflow in 2^27 trips. */
#define W8 0x01010180
#define X8 0x01017FFF

#if defined(__AVX512VNNI__)
static void act8(ivec x[2]) { x[0] = x[1] = ISET1(X8); }
static inline ivec dot8(ivec a, ivec w, const ivec x[2]) { return _mm512_dpbusd_epi32(a, w, x[0]); }
#else
/* Bytes b and b + 2 of x sign-extended into the two int16 halves of a 32-bit lane. */
static int sext_pair(unsigned x, int b) {
    short lo = (signed char)(x >> (8 * b)), hi = (signed char)(x >> (8 * b + 16));
    return (int)((unsigned short)lo | (unsigned)(unsigned short)hi << 16);
}
/* The activations' pairs (bytes 0, 2 and 1, 3) are sign-extended once: a kernel does that once
 * per broadcast row, not per weight vector. */
static void act8(ivec x[2]) { x[0] = ISET1(sext_pair(X8, 0)); x[1] = ISET1(sext_pair(X8, 1)); }
/* The weights' pairs zero-extended with an and, a shift and an and, then 2 pmaddwd + 2 paddd. */
static inline ivec dot8(ivec a, ivec w, const ivec x[2]) {
    const ivec lo = ISET1(0x00FF00FF);
    ivec even = IAND(w, lo), odd = IAND(ISHR32(w, 8), lo);
    return IADD(IADD(a, IMADD(even, x[0])), IMADD(odd, x[1]));
}
#endif

/* The chains' sum, over every lane, as the result. */
static float lanes_total(const ivec *a) {
    ivec s = a[0];
    _Pragma("GCC unroll 16") for (int j = 1; j < INT8_ACCS; j++) s = IADD(s, a[j]);
    int t[INT8_LANES];
    ISTORE(t, s);
    float total = 0.0f;
    for (int j = 0; j < INT8_LANES; j++) total += (float)t[j];
    return total;
}

/* INT8_ACCS chains of dot8, as the rows of a register tile: each trip takes a new weight
 * vector, which every chain (row) multiplies, so a split of its bytes is done once for all
 * of them, as the kernel's tiles do. The empty asm statements cost no instruction: on the
 * accumulators, they keep gcc from merging the identical chains into one; on the weights,
 * from hoisting their split out of the loop; on the activations, from multiplying once for
 * every row. */
static void *dot8_worker(void *p) {
    fma_job *job = (fma_job *)p;
    ivec w = ISET1(W8), x[2], a[INT8_ACCS];
    act8(x);
    _Pragma("GCC unroll 16") for (int j = 0; j < INT8_ACCS; j++) {
        a[j] = ISET1(0);
        __asm__("" : "+v"(a[j]));
    }
    for (long i = 0; i < job->iters; i++) {
        __asm__ volatile("" : "+v"(w));
        _Pragma("GCC unroll 16") for (int j = 0; j < INT8_ACCS; j++) {
            __asm__ volatile("" : "+v"(x[0]), "+v"(x[1]));
            a[j] = dot8(a[j], w, x);
        }
    }
    job->result = lanes_total(a);
    return NULL;
}

#if !defined(__AVX512VNNI__)
/* int4's dot8 without VNNI (the kernel's h16): weight bytes below 128, so one pmaddubsw makes
 * each pair's sum and a paddw adds it to a 16-bit half; every 8 dot8 (a block of 32 values)
 * a pmaddwd by ones and a paddd fold the halves into the 32-bit sum. Weight bytes 15, 1, 1, 1
 * times activation bytes -1, 8, 4, 4 add exactly 1 a lane, as W8 and X8 do; `iters` is a
 * multiple of 8. */
#define W4 0x0101010F
#define X4 0x040408FF
#if INT8_LANES == 16
#define IMADDUBS(w, x) _mm512_maddubs_epi16(w, x)
#define IADD16(a, b) _mm512_add_epi16(a, b)
#else
#define IMADDUBS(w, x) _mm256_maddubs_epi16(w, x)
#define IADD16(a, b) _mm256_add_epi16(a, b)
#endif
static void *dot8_h16_worker(void *p) {
    fma_job *job = (fma_job *)p;
    const ivec ones = ISET1(0x00010001);
    ivec w = ISET1(W4), x = ISET1(X4), a[INT8_ACCS], h[INT8_ACCS];
    _Pragma("GCC unroll 16") for (int j = 0; j < INT8_ACCS; j++) {
        a[j] = h[j] = ISET1(0);
        __asm__("" : "+v"(a[j]), "+v"(h[j]));
    }
    for (long i = 0; i < job->iters; i += 8) {
        _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) {
            __asm__ volatile("" : "+v"(w));
            _Pragma("GCC unroll 16") for (int j = 0; j < INT8_ACCS; j++) {
                __asm__ volatile("" : "+v"(x));
                h[j] = IADD16(h[j], IMADDUBS(w, x));
                /* a chain step after step: else gcc makes the 8 steps' products first and
                 * spills them (it read this rate 0.6-0.8x of what the sequence runs at) */
                __asm__ volatile("" : "+v"(h[j]));
            }
        }
        _Pragma("GCC unroll 16") for (int j = 0; j < INT8_ACCS; j++) {
            a[j] = IADD(a[j], IMADD(h[j], ones));
            h[j] = ISET1(0);
            __asm__("" : "+v"(h[j]));
        }
    }
    job->result = lanes_total(a);
    return NULL;
}
#endif
#endif

/* A block of 32 values of the int formats' tile (the family's act = 1), per row and column
 * vector: its 8 dot8 into an integer sum started from an offset, that sum converted to f32
 * and scaled by the row's activation scale into the group's sum (vcvtdq2ps and an FMA), and
 * the group's sum scaled into the output (an FMA: a group of 32 is one block). On a core
 * whose dot8 and FMAs share ports (Zen 4's vpdpbusd) those 3 ops may cost as much as 3 dot8;
 * on one whose dot8 is a longer integer sequence (2 pmaddwd + 2 paddd on Zen 3's four vector
 * pipes) they may hide behind it: measured, not assumed. `narrow`: the h16 sequence, its halves
 * folded once a block. INT8_ACCS chains (rows) share each weight vector, as dot8_worker's
 * do; each block adds exactly 8 to each lane of its chain's output, a float that stays exact
 * below 2^21 blocks. */
#if defined(INT8_LANES)
#if INT8_LANES == 16
#define VCVT(a) _mm512_cvtepi32_ps(a)
#else
#define VCVT(a) _mm256_cvtepi32_ps(a)
#endif
static void *block_worker(void *p, int narrow) {
    fma_job *job = (fma_job *)p;
    ivec x[2];
    act8(x);
#if defined(__AVX512VNNI__)
    ivec w = ISET1(W8); /* the narrow dot8 is vpdpbusd too */
    narrow = 0;
#else
    ivec w = ISET1(narrow ? W4 : W8);
    const ivec ones = ISET1(0x00010001);
    ivec xn = ISET1(X4);
#endif
    vec out[INT8_ACCS], scale = VSET1(1.0f), zero = VSET1(0.0f);
    __asm__("" : "+v"(scale), "+v"(zero)); /* not folded: the kernel's scales are data */
    _Pragma("GCC unroll 16") for (int j = 0; j < INT8_ACCS; j++) {
        out[j] = zero;
        __asm__("" : "+v"(out[j]));
    }
    for (long i = 0; i < job->iters; i++) {
        ivec a[INT8_ACCS];
        _Pragma("GCC unroll 16") for (int j = 0; j < INT8_ACCS; j++) {
            a[j] = ISET1(0);
            __asm__ volatile("" : "+v"(a[j]));
        }
        /* each step a new weight vector, which every chain (row) multiplies */
        _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) {
            __asm__ volatile("" : "+v"(w));
            _Pragma("GCC unroll 16") for (int j = 0; j < INT8_ACCS; j++) {
#if !defined(__AVX512VNNI__)
                if (narrow) { /* 16-bit halves in a, folded below */
                    __asm__ volatile("" : "+v"(xn)); /* a row's own product, as x below */
                    a[j] = IADD16(a[j], IMADDUBS(w, xn));
                } else
#endif
                {
                    __asm__ volatile("" : "+v"(x[0]), "+v"(x[1]));
                    a[j] = dot8(a[j], w, x);
                }
                /* each row's sum a chain, step after step, as in the tile: without this gcc
                 * makes every product of the block first and spills them */
                __asm__ volatile("" : "+v"(a[j]));
            }
        }
        _Pragma("GCC unroll 16") for (int j = 0; j < INT8_ACCS; j++) {
#if !defined(__AVX512VNNI__)
            if (narrow)
                a[j] = IMADD(a[j], ones);
#endif
            vec g = VFMA(VCVT(a[j]), scale, zero);
            out[j] = VFMA(g, scale, out[j]);
        }
    }
    vec s = out[0];
    _Pragma("GCC unroll 16") for (int j = 1; j < INT8_ACCS; j++) s = VADD(s, out[j]);
    float t[LANES], total = 0.0f;
    VSTORE(t, s);
    for (int j = 0; j < LANES; j++) total += t[j];
    job->result = total;
    return NULL;
}
static void *block_full_worker(void *p) { return block_worker(p, 0); }
static void *block_narrow_worker(void *p) { return block_worker(p, 1); }
#endif

/* `iters` blocks per chain; -1 where the build has no int8 dot (AVX-512 without AVX-512BW). */
int mb_dot8_block(int threads, long iters, float *out) {
#if defined(INT8_LANES)
    return run_iters(threads, iters, block_full_worker, out);
#else
    (void)threads; (void)iters; (void)out;
    return -1;
#endif
}

/* The same on int4's weight bytes (the narrow dot8). */
int mb_dot8_block_narrow(int threads, long iters, float *out) {
#if defined(INT8_LANES)
    return run_iters(threads, iters, block_narrow_worker, out);
#else
    (void)threads; (void)iters; (void)out;
    return -1;
#endif
}

int mb_dpbusd(int threads, long iters, float *out) {
#if defined(INT8_LANES)
    return run_iters(threads, iters, dot8_worker, out);
#else
    (void)threads; (void)iters; (void)out;
    return -1;
#endif
}

/* int4's dot8 as the kernel runs it: vpdpbusd with VNNI, else the h16 sequence above. */
int mb_dot8_narrow(int threads, long iters, float *out) {
#if defined(INT8_LANES) && !defined(__AVX512VNNI__)
    if (iters % 8)
        return -2;
    return run_iters(threads, iters, dot8_h16_worker, out);
#else
    return mb_dpbusd(threads, iters, out);
#endif
}

/* Dequantization (DECA's vector work, VOS): the instruction sequence that turns one format's
 * stored weights into what its products take, on registers only, DQ_ACCS independent weight
 * registers per thread, and nothing else in the loop, so the rate is the sequence's own.
 * Kinds, vector ops per step, and what a step does (for how many weight vectors of f32 lanes):
 *   DQ_NIBBLES     3  int4 for the 8-bit dot: 8 nibbles a 32-bit lane (8), and / shift / and
 *   DQ_INT8_WIDEN  2  int8 for f32 FMAs (1): vpmovsxbd, vcvtdq2ps
 *   DQ_INT4_WIDEN  5  int4 for f32 FMAs (2): vpmovzxbd, and, shift, 2 vcvtdq2ps
 *   DQ_BF16_WIDEN  2  bf16 pairs for f32 FMAs where the CPU has no bf16 dot (2): shift, and */
#define DQ_ACCS 8
enum { DQ_NIBBLES, DQ_INT8_WIDEN, DQ_INT4_WIDEN, DQ_BF16_WIDEN, DQ_KINDS };
static const int dq_ops[DQ_KINDS] = {3, 2, 5, 2};
#define DQ_WORD 0x4A3C9F71u /* bytes with both nibble halves and both signs */
#define DQ_BF16 0x40003F80u /* bf16 2.0 and 1.0: each step widens them into normal floats */

#if defined(__AVX512F__)
typedef __m512i dvec;
#define DSET1(x) _mm512_set1_epi32((int)(x))
#define DAND(a, b) _mm512_and_si512(a, b)
#define DLOW(a) _mm512_castsi512_si128(a)
#define DCVT(a) _mm512_cvtepi32_ps(a)
#define DADDF(a, b) _mm512_add_ps(a, b)
#define VPAND "vpandd" /* vpand has no 512-bit form */
#else
typedef __m256i dvec;
#define DSET1(x) _mm256_set1_epi32((int)(x))
#define DAND(a, b) _mm256_and_si256(a, b)
#define DLOW(a) _mm256_castsi256_si128(a)
#define DCVT(a) _mm256_cvtepi32_ps(a)
#define DADDF(a, b) _mm256_add_ps(a, b)
#define VPAND "vpand" /* vpandd on ymm would be AVX512VL */
#endif

/* One step of kind K on the weight register w, written as the instructions themselves: a
 * volatile asm is neither hoisted out of the loop nor merged with an identical one, and
 * gcc adds no copies around it. The outputs are the dequantized vectors. */
#define DQ_ASM(code, out_a, out_b, in, mask) \
    __asm__ volatile(code : [a] "=&v"(out_a), [b] "=&v"(out_b) : [w] "v"(in), [c] "v"(mask))
static inline void dq_asm(int kind, dvec w, vec *a, vec *b) {
    const dvec nib = DSET1(0x0F0F0F0Fu), low4 = DSET1(15), high16 = DSET1(0xFFFF0000u);
    dvec x, y;
    switch (kind) {
    case DQ_NIBBLES: /* x, y: the low and the high nibbles, each still in its byte */
        DQ_ASM(VPAND " %[c], %[w], %[a]\n\tvpsrld $4, %[w], %[b]\n\t" VPAND " %[c], %[b], %[b]",
               x, y, w, nib);
        *a = DCVT(DAND(x, low4)), *b = DCVT(DAND(y, low4)); /* the check's first nibbles */
        break;
    case DQ_INT8_WIDEN:
        DQ_ASM("vpmovsxbd %x[w], %[b]\n\tvcvtdq2ps %[b], %[a]", *a, y, w, nib);
        *b = VSET1(0.0f);
        (void)y;
        break;
    case DQ_INT4_WIDEN:
        DQ_ASM("vpmovzxbd %x[w], %[b]\n\t" VPAND " %[c], %[b], %[a]\n\tvpsrld $4, %[b], %[b]\n\t"
               "vcvtdq2ps %[a], %[a]\n\tvcvtdq2ps %[b], %[b]", *a, *b, w, low4);
        break;
    default:
        DQ_ASM("vpslld $16, %[w], %[a]\n\t" VPAND " %[c], %[w], %[b]", *a, *b, w, high16);
    }
}

typedef struct {
    long iters;
    float result;
} dq_job;

/* A worker per kind, so that the kind is a constant in its loop and gcc keeps the weight
 * registers in registers (a switch around the loops made it keep them on the stack). */
#define DQ_WORKER(K, BASE)                                                        \
    static void *dq_worker_##K(void *p) {                                         \
        dq_job *job = (dq_job *)p;                                                \
        dvec w[DQ_ACCS];                                                          \
        vec sum = VSET1(0.0f), a, b;                                              \
        _Pragma("GCC unroll 16") for (int j = 0; j < DQ_ACCS; j++) w[j] = DSET1(BASE + j); \
        for (long i = 0; i < job->iters; i++) {                                   \
            _Pragma("GCC unroll 16") for (int j = 0; j < DQ_ACCS; j++) dq_asm(K, w[j], &a, &b); \
        }                                                                         \
        _Pragma("GCC unroll 16") for (int j = 0; j < DQ_ACCS; j++) {              \
            dq_asm(K, w[j], &a, &b);                                              \
            sum = DADDF(sum, DADDF(a, b));                                        \
        }                                                                         \
        job->result = hsum(sum);                                                  \
        return NULL;                                                              \
    }
DQ_WORKER(DQ_NIBBLES, DQ_WORD)
DQ_WORKER(DQ_INT8_WIDEN, DQ_WORD)
DQ_WORKER(DQ_INT4_WIDEN, DQ_WORD)
DQ_WORKER(DQ_BF16_WIDEN, DQ_BF16)
#undef DQ_WORKER

/* The same outputs' sum from scalar arithmetic, for the check. */
static float dq_expected(int kind) {
    double s = 0.0;
    for (int j = 0; j < DQ_ACCS; j++) {
        unsigned w = (kind == DQ_BF16_WIDEN ? DQ_BF16 : DQ_WORD) + j;
        double part = 0.0;
        for (int b = 0; b < 4; b++) {
            unsigned byte = (w >> (8 * b)) & 0xFF;
            if (kind == DQ_NIBBLES) part += (b == 0 ? (w & 15) + ((w >> 4) & 15) : 0);
            else if (kind == DQ_INT8_WIDEN) part += (signed char)byte;
            else if (kind == DQ_INT4_WIDEN) part += (byte & 15) + (byte >> 4);
        }
        if (kind == DQ_BF16_WIDEN) {
            union { unsigned u; float f; } lo = {w << 16}, hi = {w & 0xFFFF0000u};
            part = (double)lo.f + hi.f;
            s += part * LANES;
        } else if (kind == DQ_INT8_WIDEN || kind == DQ_INT4_WIDEN) {
            s += part * (LANES / 4); /* the lanes cycle through the 4 bytes of a word */
        } else {
            s += part * LANES;
        }
    }
    return (float)s;
}

int mb_dequant_kinds(void) { return DQ_KINDS; }
int mb_dequant_ops(int kind) { return kind >= 0 && kind < DQ_KINDS ? dq_ops[kind] : 0; }
int mb_dequant_accs(void) { return DQ_ACCS; }

/* `iters` steps of `kind` on each of DQ_ACCS weight registers per thread; -3 when the
 * outputs are not the scalar dequantization's. */
int mb_dequant(int kind, int threads, long iters, float *out) {
    if (kind < 0 || kind >= DQ_KINDS || threads < 1 || threads > MAX_THREADS || iters < 1) return -1;
    dq_job jobs[MAX_THREADS];
    for (int t = 0; t < threads; t++) jobs[t].iters = iters;
    static void *(*const workers[DQ_KINDS])(void *) = {
        dq_worker_DQ_NIBBLES, dq_worker_DQ_INT8_WIDEN, dq_worker_DQ_INT4_WIDEN, dq_worker_DQ_BF16_WIDEN};
    int rc = run_threads(threads, workers[kind], jobs, sizeof(dq_job));
    float want = dq_expected(kind), s = 0.0f;
    for (int t = 0; t < threads; t++) {
        if (jobs[t].result != want) rc = rc ? rc : -3;
        s += jobs[t].result;
    }
    *out = s;
    return rc;
}
