/*
 * qd_driver: the same I/O load over NFSv3 (libnfs's RPC layer) or NBD (libnbd), for comparing
 * lograid's two exports of one volume. One connection, QD requests kept in flight.
 *
 *   qd_driver nfs HOST PORT FILE  WORKLOAD REGION_MIB SIZE QD SECONDS
 *   qd_driver nbd URI             WORKLOAD REGION_MIB SIZE QD SECONDS
 *
 * WORKLOAD: seqwrite, seqread (SIZE-byte requests in order over the first REGION_MIB MiB,
 * wrapping), randwrite, randread (SIZE-aligned offsets at random in that region). Runs for
 * SECONDS; writes end with one COMMIT (NFS, writes are UNSTABLE) or FLUSH (NBD), counted in
 * the time. Prints "proto workload size qd ops seconds MiB/s IOPS client_cpu_seconds".
 */
#include <inttypes.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <libnbd.h>
#include <nfsc/libnfs.h>
#include <nfsc/libnfs-raw.h>
#include <nfsc/libnfs-raw-mount.h>
#include <nfsc/libnfs-raw-nfs.h>

static int in_flight, failed;
static uint64_t done_ops;
static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static uint64_t next_rand(void) {
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1DULL;
}

static void fail(const char *what) {
    fprintf(stderr, "qd_driver: %s\n", what);
    exit(2);
}

struct load {
    int write, random;
    uint64_t region, size, next;
};

static uint64_t next_offset(struct load *l) {
    uint64_t slots = l->region / l->size;
    if (l->random) return (next_rand() % slots) * l->size;
    uint64_t offset = l->next;
    l->next = (l->next + l->size) % (slots * l->size);
    return offset;
}

/* ---------------------------------------------------------------- NFS */

static struct rpc_context *rpc;
static char fh_bytes[64];
static unsigned fh_len;
static int step_done;

static void nfs_wait(int *flag) {
    while (!*flag && !failed) {
        struct pollfd pfd = {.fd = rpc_get_fd(rpc), .events = rpc_which_events(rpc)};
        if (poll(&pfd, 1, 1000) < 0) fail("poll");
        if (rpc_service(rpc, pfd.revents) < 0) fail(rpc_get_error(rpc));
    }
    if (failed) fail("rpc failed");
}

static void on_step(struct rpc_context *r, int status, void *data, void *priv) {
    (void)r;
    if (status != RPC_STATUS_SUCCESS) { failed = 1; return; }
    if (priv == (void *)1) {
        mountres3 *res = data;
        if (res->fhs_status != MNT3_OK) { failed = 1; return; }
        fh_len = res->mountres3_u.mountinfo.fhandle.fhandle3_len;
        memcpy(fh_bytes, res->mountres3_u.mountinfo.fhandle.fhandle3_val, fh_len);
    } else if (priv == (void *)2) {
        LOOKUP3res *res = data;
        if (res->status != NFS3_OK) { failed = 1; return; }
        fh_len = res->LOOKUP3res_u.resok.object.data.data_len;
        memcpy(fh_bytes, res->LOOKUP3res_u.resok.object.data.data_val, fh_len);
    } else if (priv == (void *)3) {
        COMMIT3res *res = data;
        if (res->status != NFS3_OK) failed = 1;
    }
    step_done = 1;
}

static void on_io(struct rpc_context *r, int status, void *data, void *priv) {
    (void)r; (void)priv;
    in_flight--;
    if (status != RPC_STATUS_SUCCESS || *(nfsstat3 *)data != NFS3_OK) { failed = 1; return; }
    done_ops++;
}

static void nfs_setup(const char *host, int port, const char *file) {
    rpc = rpc_init_context();
    rpc_set_auth(rpc, libnfs_authunix_create_default());
    step_done = 0;
    if (rpc_connect_port_async(rpc, host, port, 100005, 3, on_step, NULL)) fail("connect");
    nfs_wait(&step_done);
    step_done = 0;
    if (rpc_mount3_mnt_async(rpc, on_step, "/", (void *)1)) fail("mnt");
    nfs_wait(&step_done);
    LOOKUP3args args = {.what = {.dir = {.data = {.data_len = fh_len, .data_val = fh_bytes}}, .name = (char *)file}};
    step_done = 0;
    if (rpc_nfs3_lookup_async(rpc, on_step, &args, (void *)2)) fail("lookup");
    nfs_wait(&step_done);
}

static void nfs_issue(struct load *l, char *buf) {
    nfs_fh3 fh = {.data = {.data_len = fh_len, .data_val = fh_bytes}};
    uint64_t offset = next_offset(l);
    int rc;
    if (l->write) {
        WRITE3args args = {.file = fh, .offset = offset, .count = l->size, .stable = UNSTABLE};
        args.data.data_len = l->size;
        args.data.data_val = buf;
        rc = rpc_nfs3_write_async(rpc, on_io, &args, NULL);
    } else {
        READ3args args = {.file = fh, .offset = offset, .count = l->size};
        rc = rpc_nfs3_read_async(rpc, on_io, &args, NULL);
    }
    if (rc) fail("queue");
    in_flight++;
}

static void nfs_run(struct load *l, int qd, double seconds, char *buf) {
    double end = now() + seconds;
    while (now() < end || in_flight > 0) {
        while (in_flight < qd && now() < end) nfs_issue(l, buf);
        struct pollfd pfd = {.fd = rpc_get_fd(rpc), .events = rpc_which_events(rpc)};
        if (poll(&pfd, 1, 1000) < 0) fail("poll");
        if (rpc_service(rpc, pfd.revents) < 0) fail(rpc_get_error(rpc));
        if (failed) fail("I/O failed");
    }
    if (l->write) {
        nfs_fh3 fh = {.data = {.data_len = fh_len, .data_val = fh_bytes}};
        COMMIT3args args = {.file = fh};
        step_done = 0;
        if (rpc_nfs3_commit_async(rpc, on_step, &args, (void *)3)) fail("commit");
        nfs_wait(&step_done);
    }
}

/* ---------------------------------------------------------------- NBD */

static int nbd_done(void *user_data, int *error) {
    (void)user_data;
    in_flight--;
    if (*error) failed = 1; else done_ops++;
    return 1;
}

static void nbd_run(struct nbd_handle *h, struct load *l, int qd, double seconds, char *buf) {
    double end = now() + seconds;
    nbd_completion_callback cb = {.callback = nbd_done};
    while (now() < end || in_flight > 0) {
        while (in_flight < qd && now() < end) {
            uint64_t offset = next_offset(l);
            int64_t rc = l->write ? nbd_aio_pwrite(h, buf, l->size, offset, cb, 0)
                                  : nbd_aio_pread(h, buf, l->size, offset, cb, 0);
            if (rc < 0) fail(nbd_get_error());
            in_flight++;
        }
        if (nbd_poll(h, -1) < 0) fail(nbd_get_error());
        if (failed) fail("I/O failed");
    }
    if (l->write && nbd_flush(h, 0) < 0) fail(nbd_get_error());
}

int main(int argc, char **argv) {
    int nfs = argc == 10 && !strcmp(argv[1], "nfs");
    int nbd = argc == 8 && !strcmp(argv[1], "nbd");
    if (!nfs && !nbd) {
        fprintf(stderr, "usage: qd_driver nfs HOST PORT FILE WORKLOAD REGION_MIB SIZE QD SECONDS\n"
                        "       qd_driver nbd URI WORKLOAD REGION_MIB SIZE QD SECONDS\n");
        return 2;
    }
    char **rest = argv + (nfs ? 5 : 3);
    const char *workload = rest[0];
    struct load l = {.write = strstr(workload, "write") != NULL, .random = !strncmp(workload, "rand", 4),
                     .region = strtoull(rest[1], NULL, 10) << 20, .size = strtoull(rest[2], NULL, 10)};
    int qd = atoi(rest[3]);
    double seconds = atof(rest[4]);
    char *buf = malloc(l.size);
    for (uint64_t i = 0; i < l.size; i++) buf[i] = (char)next_rand();
    double start;
    if (nfs) {
        nfs_setup(argv[2], atoi(argv[3]), argv[4]);
        start = now();
        nfs_run(&l, qd, seconds, buf);
    } else {
        struct nbd_handle *h = nbd_create();
        if (!h || nbd_connect_uri(h, argv[2]) < 0) fail(nbd_get_error());
        start = now();
        nbd_run(h, &l, qd, seconds, buf);
        nbd_close(h);
    }
    double took = now() - start;
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    double cpu = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + usage.ru_stime.tv_sec +
                 usage.ru_stime.tv_usec / 1e6;
    printf("%s %s %" PRIu64 " %d %" PRIu64 " %.3f %.1f %.0f %.2f\n", nfs ? "nfs" : "nbd", workload, l.size, qd,
           done_ops, took, done_ops * (double)l.size / took / (1 << 20), done_ops / took, cpu);
    return 0;
}
