/*
 * nfs_probe: a small NFSv3 client on libnfs's raw RPC layer, for lograid's tests. It talks to
 * one server (MOUNT and NFS on one port) and runs the steps given as arguments, in order, on
 * one connection, printing one line per step. Unlike libnfs's file API it shows what the tests
 * are about: write verifiers, stable_how, COMMIT, handles kept across server restarts.
 *
 *   nfs_probe HOST PORT STEP...
 *     mount                       MNT "/": the root handle becomes the current handle
 *     lookup:NAME                 LOOKUP NAME in the root: the current handle
 *     handle:HEX                  use this handle (from an earlier run) as the current one
 *     getattr                     "attr type=T mode=M nlink=N size=S used=U fileid=F"
 *     write:OFF:LEN:SEED:STABLE   one WRITE of a pattern; "write status=S count=C committed=K verf=V"
 *     writes:OFF:LEN:N:SEED:STABLE  N WRITEs of LEN bytes back to back, all in flight at once;
 *                                 "writes status=S verf=V" (S the first error status, else 0)
 *     read:OFF:LEN                "read status=S count=C eof=E fnv=H" (FNV-1a 64 of the data)
 *     commit                      "commit status=S verf=V"
 *     setattr-size:N              "setattr status=S"
 *     fsinfo                      "fsinfo rtmax=R wtmax=W maxfilesize=M"
 * The pattern of WRITE SEED at file offset P is byte (SEED * 131 + P * 7 + (P >> 9)) & 0xff.
 * Exit status: 0, or 2 when the connection or an RPC fails (a non-OK NFS status is printed, not
 * an error).
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nfsc/libnfs.h>
#include <nfsc/libnfs-raw.h>
#include <nfsc/libnfs-raw-mount.h>
#include <nfsc/libnfs-raw-nfs.h>

#define MOUNT_PROGRAM 100005
#define MOUNT_VERSION 3

static struct rpc_context *rpc;
static int pending;
static int failed;
static char root[64], current[64];
static unsigned root_len, current_len;
static char last_verf[8];
static int first_status;

static void die(const char *what) {
    fprintf(stderr, "nfs_probe: %s: %s\n", what, rpc ? rpc_get_error(rpc) : "");
    exit(2);
}

static void wait_all(void) {
    while (pending > 0 && !failed) {
        struct pollfd pfd = {.fd = rpc_get_fd(rpc), .events = rpc_which_events(rpc)};
        if (poll(&pfd, 1, 1000) < 0) die("poll");
        if (rpc_service(rpc, pfd.revents) < 0) die("rpc_service");
    }
    if (failed) die("rpc call failed");
}

static int check(int status, void *data) {
    pending--;
    if (status != RPC_STATUS_SUCCESS) {
        fprintf(stderr, "nfs_probe: rpc error: %s\n", status == RPC_STATUS_ERROR ? (char *)data : "cancelled");
        failed = 1;
        return 0;
    }
    return 1;
}

static void print_hex(const char *bytes, unsigned len) {
    for (unsigned i = 0; i < len; i++) printf("%02x", (unsigned char)bytes[i]);
}

static void connected(struct rpc_context *r, int status, void *data, void *priv) {
    (void)r; (void)priv;
    check(status, data);
}

static void mounted(struct rpc_context *r, int status, void *data, void *priv) {
    (void)r; (void)priv;
    if (!check(status, data)) return;
    mountres3 *res = data;
    printf("mount status=%d", res->fhs_status);
    if (res->fhs_status == MNT3_OK) {
        root_len = res->mountres3_u.mountinfo.fhandle.fhandle3_len;
        memcpy(root, res->mountres3_u.mountinfo.fhandle.fhandle3_val, root_len);
        memcpy(current, root, root_len);
        current_len = root_len;
        printf(" handle=");
        print_hex(root, root_len);
    }
    printf("\n");
}

static void looked_up(struct rpc_context *r, int status, void *data, void *priv) {
    (void)r; (void)priv;
    if (!check(status, data)) return;
    LOOKUP3res *res = data;
    printf("lookup status=%d", res->status);
    if (res->status == NFS3_OK) {
        current_len = res->LOOKUP3res_u.resok.object.data.data_len;
        memcpy(current, res->LOOKUP3res_u.resok.object.data.data_val, current_len);
        printf(" handle=");
        print_hex(current, current_len);
    }
    printf("\n");
}

static void print_attr(const fattr3 *a) {
    printf(" type=%d mode=%o nlink=%u size=%" PRIu64 " used=%" PRIu64 " fileid=%" PRIu64 " uid=%u gid=%u",
           a->type, a->mode, a->nlink, (uint64_t)a->size, (uint64_t)a->used, (uint64_t)a->fileid,
           a->uid, a->gid);
}

static void got_attr(struct rpc_context *r, int status, void *data, void *priv) {
    (void)r; (void)priv;
    if (!check(status, data)) return;
    GETATTR3res *res = data;
    printf("attr status=%d", res->status);
    if (res->status == NFS3_OK) print_attr(&res->GETATTR3res_u.resok.obj_attributes);
    printf("\n");
}

static void written(struct rpc_context *r, int status, void *data, void *priv) {
    (void)r;
    if (!check(status, data)) return;
    WRITE3res *res = data;
    int quiet = priv != NULL;
    if (res->status != NFS3_OK && first_status == 0) first_status = res->status;
    if (res->status == NFS3_OK) memcpy(last_verf, res->WRITE3res_u.resok.verf, 8);
    if (quiet) return;
    printf("write status=%d", res->status);
    if (res->status == NFS3_OK) {
        printf(" count=%u committed=%d verf=", res->WRITE3res_u.resok.count, res->WRITE3res_u.resok.committed);
        print_hex(res->WRITE3res_u.resok.verf, 8);
    }
    printf("\n");
}

static void was_read(struct rpc_context *r, int status, void *data, void *priv) {
    (void)r; (void)priv;
    if (!check(status, data)) return;
    READ3res *res = data;
    printf("read status=%d", res->status);
    if (res->status == NFS3_OK) {
        uint64_t h = 0xcbf29ce484222325ULL;
        const unsigned char *p = (const unsigned char *)res->READ3res_u.resok.data.data_val;
        for (unsigned i = 0; i < res->READ3res_u.resok.data.data_len; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
        printf(" count=%u eof=%d fnv=%016" PRIx64, res->READ3res_u.resok.count, res->READ3res_u.resok.eof, h);
    }
    printf("\n");
}

static void committed(struct rpc_context *r, int status, void *data, void *priv) {
    (void)r; (void)priv;
    if (!check(status, data)) return;
    COMMIT3res *res = data;
    printf("commit status=%d", res->status);
    if (res->status == NFS3_OK) {
        printf(" verf=");
        print_hex(res->COMMIT3res_u.resok.verf, 8);
    }
    printf("\n");
}

static void set_attr(struct rpc_context *r, int status, void *data, void *priv) {
    (void)r; (void)priv;
    if (!check(status, data)) return;
    SETATTR3res *res = data;
    printf("setattr status=%d\n", res->status);
}

static void got_fsinfo(struct rpc_context *r, int status, void *data, void *priv) {
    (void)r; (void)priv;
    if (!check(status, data)) return;
    FSINFO3res *res = data;
    printf("fsinfo status=%d", res->status);
    if (res->status == NFS3_OK) {
        FSINFO3resok *ok = &res->FSINFO3res_u.resok;
        printf(" rtmax=%u wtmax=%u maxfilesize=%" PRIu64, ok->rtmax, ok->wtmax, (uint64_t)ok->maxfilesize);
    }
    printf("\n");
}

static nfs_fh3 fh(void) {
    nfs_fh3 f = {.data = {.data_len = current_len, .data_val = current}};
    return f;
}

static void fill(char *buf, uint64_t offset, uint32_t len, uint32_t seed) {
    for (uint32_t i = 0; i < len; i++) {
        uint64_t p = offset + i;
        buf[i] = (char)((seed * 131 + p * 7 + (p >> 9)) & 0xff);
    }
}

static void queue_write(uint64_t offset, uint32_t len, uint32_t seed, int stable, int quiet, char *buf) {
    fill(buf, offset, len, seed);
    WRITE3args args = {.file = fh(), .offset = offset, .count = len, .stable = stable};
    args.data.data_len = len;
    args.data.data_val = buf;
    if (rpc_nfs3_write_async(rpc, written, &args, quiet ? (void *)1 : NULL) != 0) die("write");
    pending++;
}

static void step(const char *text) {
    char name[32] = {0};
    sscanf(text, "%31[^:]", name);
    const char *arg = strchr(text, ':') ? strchr(text, ':') + 1 : "";
    if (!strcmp(name, "mount")) {
        if (rpc_mount3_mnt_async(rpc, mounted, "/", NULL) != 0) die("mnt");
        pending++;
    } else if (!strcmp(name, "lookup")) {
        LOOKUP3args args = {.what = {.dir = {.data = {.data_len = root_len, .data_val = root}}, .name = (char *)arg}};
        if (rpc_nfs3_lookup_async(rpc, looked_up, &args, NULL) != 0) die("lookup");
        pending++;
    } else if (!strcmp(name, "handle")) {
        current_len = strlen(arg) / 2;
        for (unsigned i = 0; i < current_len; i++) sscanf(arg + 2 * i, "%2hhx", (unsigned char *)&current[i]);
        printf("handle set\n");
        return;
    } else if (!strcmp(name, "getattr")) {
        GETATTR3args args = {.object = fh()};
        if (rpc_nfs3_getattr_async(rpc, got_attr, &args, NULL) != 0) die("getattr");
        pending++;
    } else if (!strcmp(name, "write")) {
        uint64_t offset; uint32_t len, seed; int stable;
        if (sscanf(arg, "%" SCNu64 ":%u:%u:%d", &offset, &len, &seed, &stable) != 4) die("write arguments");
        char *buf = malloc(len ? len : 1);
        queue_write(offset, len, seed, stable, 0, buf);
        wait_all();
        free(buf);
        return;
    } else if (!strcmp(name, "writes")) {
        uint64_t offset; uint32_t len, n, seed; int stable;
        if (sscanf(arg, "%" SCNu64 ":%u:%u:%u:%d", &offset, &len, &n, &seed, &stable) != 5) die("writes arguments");
        char *buf = malloc((size_t)len * n);
        first_status = 0;
        for (uint32_t i = 0; i < n; i++) queue_write(offset + (uint64_t)i * len, len, seed, stable, 1, buf + (size_t)i * len);
        wait_all();
        free(buf);
        printf("writes status=%d verf=", first_status);
        print_hex(last_verf, 8);
        printf("\n");
        return;
    } else if (!strcmp(name, "read")) {
        uint64_t offset; uint32_t len;
        if (sscanf(arg, "%" SCNu64 ":%u", &offset, &len) != 2) die("read arguments");
        READ3args args = {.file = fh(), .offset = offset, .count = len};
        if (rpc_nfs3_read_async(rpc, was_read, &args, NULL) != 0) die("read");
        pending++;
    } else if (!strcmp(name, "commit")) {
        COMMIT3args args = {.file = fh(), .offset = 0, .count = 0};
        if (rpc_nfs3_commit_async(rpc, committed, &args, NULL) != 0) die("commit");
        pending++;
    } else if (!strcmp(name, "setattr-size")) {
        SETATTR3args args;
        memset(&args, 0, sizeof args);
        args.object = fh();
        args.new_attributes.size.set_it = 1;
        args.new_attributes.size.set_size3_u.size = strtoull(arg, NULL, 10);
        if (rpc_nfs3_setattr_async(rpc, set_attr, &args, NULL) != 0) die("setattr");
        pending++;
    } else if (!strcmp(name, "fsinfo")) {
        FSINFO3args args = {.fsroot = fh()};
        if (rpc_nfs3_fsinfo_async(rpc, got_fsinfo, &args, NULL) != 0) die("fsinfo");
        pending++;
    } else {
        fprintf(stderr, "nfs_probe: unknown step %s\n", text);
        exit(2);
    }
    wait_all();
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: nfs_probe HOST PORT STEP...\n");
        return 2;
    }
    rpc = rpc_init_context();
    if (!rpc) die("rpc_init_context");
    rpc_set_auth(rpc, libnfs_authunix_create_default());
    if (rpc_connect_port_async(rpc, argv[1], atoi(argv[2]), MOUNT_PROGRAM, MOUNT_VERSION, connected, NULL) != 0) die("connect");
    pending++;
    wait_all();
    for (int i = 3; i < argc; i++) {
        step(argv[i]);
        fflush(stdout);
    }
    rpc_destroy_context(rpc);
    return 0;
}
