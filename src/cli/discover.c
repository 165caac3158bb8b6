/* discover.c - `lmx discover DIR`: every model directory (config.json + *.safetensors) and GGUF
 * file under DIR, with its architecture, parameters, dtype / quantization and size on disk. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/fileio.h"
#include "cli.h"
#include "lmx.h"

#define MAX_DEPTH 8

static void show(const char *path, long long disk_bytes, int *found) {
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = "cpu";
    lp.n_threads = 1;
    lmx_model *m = NULL;
    (*found)++;
    if (lmx_model_load(path, &lp, &m) != LMX_OK) {
        printf("%-60s  (not loadable: %s)\n", path, lmx_last_error(NULL));
        return;
    }
    lmx_model_info in;
    lmx_model_get_info(m, &in);
    printf("%-60s  %-8s %8.1fM params  %-6s %9.1f MB\n", path, in.architecture, (double)in.n_params / 1e6, in.dtype,
           (double)disk_bytes / 1e6);
    lmx_model_free(m);
}

static void walk(const char *dir, int depth, int *found) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    int has_config = 0, has_st = 0;
    long long dir_bytes = 0;
    char **subdirs = NULL;
    int n_sub = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(path, &st)) continue;
        if (S_ISDIR(st.st_mode)) {
            char **g = realloc(subdirs, (size_t)(n_sub + 1) * sizeof *g);
            if (g && (g[n_sub] = strdup(path))) n_sub++;
            if (g) subdirs = g;
            continue;
        }
        dir_bytes += (long long)st.st_size;
        if (!strcmp(e->d_name, "config.json")) has_config = 1;
        if (lmx_ends_with(e->d_name, ".safetensors") && strcmp(e->d_name, "reference.safetensors")) has_st = 1;
        if (lmx_ends_with(e->d_name, ".gguf")) show(path, (long long)st.st_size, found);
    }
    closedir(d);
    if (has_config && has_st) show(dir, dir_bytes, found);
    for (int i = 0; i < n_sub; i++) {
        if (depth < MAX_DEPTH) walk(subdirs[i], depth + 1, found);
        free(subdirs[i]);
    }
    free(subdirs);
}

int cmd_discover(int argc, char **argv) {
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: lmx discover DIR\n\nList every model directory (config.json + *.safetensors) and GGUF file\n"
                   "under DIR (%d levels deep at most): architecture, parameters, dtype or quantization, size on disk.\n",
                   MAX_DEPTH);
            return 0;
        }
        if (argv[i][0] == '-') return cli_usage_error("discover: unknown option %s", argv[i]);
        if (dir) return cli_usage_error("discover: more than one directory given");
        dir = argv[i];
    }
    if (!dir) return cli_usage_error("discover: no directory given");
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "lmx: %s: no such directory\n", dir);
        return 1;
    }
    int found = 0;
    walk(dir, 0, &found);
    if (!found) printf("no models under %s\n", dir);
    return 0;
}
