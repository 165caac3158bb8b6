/* gpu_timeline.c - a GPU timeline of any CUDA program, for machines without Nsight Systems (the device
 * tool's has none).  Built as a CUDA injection library: the driver loads it at the program's first CUDA
 * call and calls InitializeInjection, which turns on CUPTI's activity records of kernels, copies,
 * memsets and synchronizations, and with GPU_TIMELINE_API=1 the runtime / driver API calls too (which
 * slow every launch by a few microseconds: the gaps between dependent kernels grow); at exit every record is
 * written to
 * $GPU_TIMELINE_OUT (default gpu_timeline.tsv), one a line:
 *     kind  start_ns  end_ns  stream  name
 * (kind K kernel, C copy, S memset, Y synchronization, R runtime API, D driver API; the API lines' stream
 * is the calling thread; with GPU_TIMELINE_CORR=1 a kernel's and an API call's name end with " #" and the
 * correlation id CUPTI gives both, so that a kernel's launch call can be found).  bench/gpu_timeline.py reads it:
 * where the GPU idles, and what the host did then.
 *
 * build: CMake builds it where CUDA's CUPTI is found (BUILD/libgpu_timeline.so); by hand,
 *        cc -O2 -shared -fPIC bench/gpu_timeline.c -I$CUDA/include -L$CUDA/lib64 -lcupti -o libgpu_timeline.so
 * use:   CUDA_INJECTION64_PATH=$PWD/libgpu_timeline.so GPU_TIMELINE_OUT=t.tsv PROGRAM ...
 * A development tool: it prints on failure and keeps its state in globals, as an injected library must. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

#define BUF_BYTES (64u << 20) /* few flushes: a flush's writing stalls the program */

static FILE *out;
static int corr; /* GPU_TIMELINE_CORR=1: kernels and API calls end their names with " #" and CUPTI's correlation id */

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, BUF_BYTES);
    *size = *buf ? BUF_BYTES : 0;
    *max_records = 0;
}

static const char *api_name(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
    const char *name = NULL;
    if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || !name) name = "?";
    return name;
}

static void write_record(const CUpti_Activity *r) {
    switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        fprintf(out, "K\t%llu\t%llu\t%u\t%s", (unsigned long long)k->start, (unsigned long long)k->end, k->streamId,
                k->name ? k->name : "?");
        if (corr) fprintf(out, " #%u", k->correlationId);
        fputc('\n', out);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *c = (const CUpti_ActivityMemcpy6 *)r;
        fprintf(out, "C\t%llu\t%llu\t%u\tcopy kind %u, %llu bytes\n", (unsigned long long)c->start,
                (unsigned long long)c->end, c->streamId, c->copyKind, (unsigned long long)c->bytes);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *s = (const CUpti_ActivityMemset4 *)r;
        fprintf(out, "S\t%llu\t%llu\t%u\tmemset %llu bytes\n", (unsigned long long)s->start,
                (unsigned long long)s->end, s->streamId, (unsigned long long)s->bytes);
        break;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
        const CUpti_ActivitySynchronization2 *y = (const CUpti_ActivitySynchronization2 *)r;
        fprintf(out, "Y\t%llu\t%llu\t%u\tsync type %d\n", (unsigned long long)y->start, (unsigned long long)y->end,
                y->streamId, (int)y->type);
        break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
        const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)r;
        const int rt = r->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
        fprintf(out, "%c\t%llu\t%llu\t%u\t%s", rt ? 'R' : 'D', (unsigned long long)a->start,
                (unsigned long long)a->end, a->threadId,
                api_name(rt ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, a->cbid));
        if (corr) fprintf(out, " #%u", a->correlationId);
        fputc('\n', out);
        break;
    }
    default:
        break;
    }
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) write_record(r);
    free(buf);
}

static void at_exit(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out);
    out = NULL;
}

int InitializeInjection(void) {
    const char *path = getenv("GPU_TIMELINE_OUT");
    if (!(out = fopen(path && *path ? path : "gpu_timeline.tsv", "w"))) {
        perror("gpu_timeline: output");
        return 0;
    }
    const char *api = getenv("GPU_TIMELINE_API"), *c = getenv("GPU_TIMELINE_CORR");
    corr = c && *c == '1';
    const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                        CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
                                        CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER};
    const size_t n_kinds = api && *api == '1' ? 6 : 4;
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
        fprintf(stderr, "gpu_timeline: cuptiActivityRegisterCallbacks failed\n");
        return 0;
    }
    for (size_t i = 0; i < n_kinds; i++)
        if (cuptiActivityEnable(kinds[i]) != CUPTI_SUCCESS)
            fprintf(stderr, "gpu_timeline: kind %d not traced\n", (int)kinds[i]);
    atexit(at_exit);
    return 1;
}
