/* fileio.c - read-only memory mapping, whole-file reads and small path helpers (POSIX). */
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Open path read-only and stat it; a non-regular file is refused. */
static lmx_status open_regular(const char *path, int *fd_out, struct stat *st, lmx_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return lmx_err_set(err, LMX_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, st) != 0) {
        int e = errno;
        close(fd);
        return lmx_err_set(err, LMX_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return lmx_err_set(err, LMX_ERR_IO, "%s: not a regular file", path);
    }
    if (st->st_size < 0 || (uintmax_t)st->st_size > (uintmax_t)SIZE_MAX / 2) {
        close(fd);
        return lmx_err_set(err, LMX_ERR_IO, "%s: file too large", path);
    }
    *fd_out = fd;
    return LMX_OK;
}

lmx_status lmx_mmap_open(const char *path, lmx_mmap *out, lmx_err *err) {
    if (!path || !out) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "lmx_mmap_open: NULL argument");
    out->data = NULL;
    out->size = 0;
    int fd;
    struct stat st;
    lmx_status s = open_regular(path, &fd, &st, err);
    if (s != LMX_OK) return s;
    size_t size = (size_t)st.st_size;
    if (size == 0) {
        close(fd);
        return LMX_OK;
    }
    void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return lmx_err_set(err, LMX_ERR_IO, "%s: cannot map: %s", path, strerror(e));
    out->data = p;
    out->size = size;
    return LMX_OK;
}

void lmx_mmap_close(lmx_mmap *m) {
    if (!m) return;
    if (m->data) munmap(m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

lmx_status lmx_read_file(const char *path, char **out, size_t *out_size, lmx_err *err) {
    if (!path || !out) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "lmx_read_file: NULL argument");
    *out = NULL;
    if (out_size) *out_size = 0;
    int fd;
    struct stat st;
    lmx_status s = open_regular(path, &fd, &st, err);
    if (s != LMX_OK) return s;
    /* The size is a hint: read until end of file, growing the buffer if the file grew. */
    size_t cap = (size_t)st.st_size + 2, len = 0; /* +1 for the NUL, +1 to see EOF */
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, cap);
    }
    for (;;) {
        if (len + 1 >= cap) {
            size_t ncap = cap < 4096 ? 4096 : cap * 2;
            char *nb = ncap > cap ? realloc(buf, ncap) : NULL;
            if (!nb) {
                free(buf);
                close(fd);
                return lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + len, cap - 1 - len);
        if (r < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            free(buf);
            close(fd);
            return lmx_err_set(err, LMX_ERR_IO, "%s: cannot read: %s", path, strerror(e));
        }
        if (r == 0) break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    *out = buf;
    if (out_size) *out_size = len;
    return LMX_OK;
}

int lmx_is_file(const char *path) {
    struct stat st;
    return path && stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

lmx_status lmx_write_file(const char *path, const void *data, size_t n, lmx_err *err) {
    FILE *fp = fopen(path, "wb");
    if (!fp || (n && fwrite(data, 1, n, fp) != n) || fclose(fp) != 0) {
        int e = errno;
        if (fp) fclose(fp);
        unlink(path);
        return lmx_err_set(err, LMX_ERR_IO, "%s: cannot write: %s", path, strerror(e));
    }
    return LMX_OK;
}

int lmx_is_dir(const char *path) {
    struct stat st;
    return path && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int lmx_ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

char *lmx_path_join(const char *dir, const char *name) {
    if (!dir || !name) return NULL;
    size_t dl = strlen(dir), nl = strlen(name);
    int sep = dl > 0 && dir[dl - 1] != '/';
    char *p = malloc(dl + (size_t)sep + nl + 1);
    if (!p) return NULL;
    memcpy(p, dir, dl);
    if (sep) p[dl] = '/';
    memcpy(p + dl + (size_t)sep, name, nl + 1);
    return p;
}
