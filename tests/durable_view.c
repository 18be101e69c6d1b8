/* LD_PRELOAD shim for the power-loss test: keep each file's *durable view*.
 *
 * After every successful fsync()/fdatasync() of a regular file directly inside
 * $KINBOX_DURABLE_WATCH (except SQLite's -shm, which is rebuilt on open), the
 * file's content is copied to $KINBOX_DURABLE_INTO/<name> (written beside it,
 * then renamed into place). That copy is exactly what the sync made durable,
 * so the copies at any instant are the files as a power cut would leave them
 * if every write since each file's last sync were lost: the worst case short
 * of torn sectors. The copy is read with pread() on the caller's own
 * descriptor: opening and closing another descriptor of the file would drop
 * the process's POSIX locks on it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void keep_durable_view(int fd) {
    const char *watch = getenv("KINBOX_DURABLE_WATCH");
    const char *into = getenv("KINBOX_DURABLE_INTO");
    char link[64], path[PATH_MAX], tmp[PATH_MAX], dst[PATH_MAX], buf[65536];
    struct stat st;
    if (!watch || !into) return;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = 0;
    size_t wl = strlen(watch);
    if (strncmp(path, watch, wl) != 0 || path[wl] != '/') return;
    const char *base = path + wl + 1;
    size_t bl = strlen(base);
    if (strchr(base, '/') || (bl > 4 && strcmp(base + bl - 4, "-shm") == 0)) return;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
    snprintf(dst, sizeof dst, "%s/%s", into, base);
    snprintf(tmp, sizeof tmp, "%s/.%s.partial", into, base);
    int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out < 0) return;
    off_t off = 0;
    while (off < st.st_size) {
        ssize_t r = pread(fd, buf, sizeof buf, off);
        if (r <= 0) break;
        if (write(out, buf, (size_t)r) != r) break;
        off += r;
    }
    close(out);
    if (off == st.st_size) rename(tmp, dst);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    int rc = real(fd);
    if (rc == 0) keep_durable_view(fd);
    return rc;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    int rc = real(fd);
    if (rc == 0) keep_durable_view(fd);
    return rc;
}
