/* The server's local socket as a client container sees it (deploy suite;
 * tests/deploy/run_container.py builds it static and runs it in a second
 * container from the image, which has no compiler and no Python).
 *
 *   local_socket_probe SOCKET_PATH
 *
 * Speaks the frames of proto/dgmm/v1/dgmm.proto's local socket section (a
 * 4-byte little-endian length, then a LocalRequest / LocalResponse; the few
 * protobuf fields it needs are encoded by hand):
 *   1. hello: prints the uid, gid and pid the kernel gave the server
 *      (SO_PEERCRED) -- across containers too.
 *   2. creates a POSIX shared-memory object (owner-only, 4096 bytes) in this
 *      container's /dev/shm and asks the server to open it by name
 *      (LocalOpenShm): prints the code (5 NOT_FOUND when the server's
 *      /dev/shm is another one).
 *   3. passes the same object's descriptor (LocalPassFd, SCM_RIGHTS): prints
 *      the code and the ticket's object_bytes.
 * One line per step, "STEP: code C ..."; exits 0 when every exchange got a
 * reply (the caller judges the codes), 2 when the socket could not be used.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

struct reply {
  long long code, uid, gid, pid, object_bytes;
  char message[512], ticket[128];
};

static int write_all(int fd, const unsigned char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) return -1;
    p += w, n -= (size_t)w;
  }
  return 0;
}

static int read_all(int fd, unsigned char *p, size_t n) {
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r <= 0) return -1;
    p += r, n -= (size_t)r;
  }
  return 0;
}

/* One frame, with `pass` (>= 0) as SCM_RIGHTS on its bytes. */
static int send_frame(int s, const unsigned char *body, size_t n, int pass) {
  unsigned char frame[4 + 512];
  frame[0] = n & 0xff, frame[1] = (n >> 8) & 0xff, frame[2] = frame[3] = 0;
  memcpy(frame + 4, body, n);
  if (pass < 0) return write_all(s, frame, n + 4);
  struct iovec iov = {frame, n + 4};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } c;
  memset(&c, 0, sizeof c);
  struct msghdr msg = {0};
  msg.msg_iov = &iov, msg.msg_iovlen = 1;
  msg.msg_control = c.buf, msg.msg_controllen = sizeof c.buf;
  struct cmsghdr *h = CMSG_FIRSTHDR(&msg);
  h->cmsg_level = SOL_SOCKET, h->cmsg_type = SCM_RIGHTS, h->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(h), &pass, sizeof(int));
  return sendmsg(s, &msg, 0) == (ssize_t)(n + 4) ? 0 : -1;
}

static int varint(const unsigned char **p, const unsigned char *end, unsigned long long *v) {
  *v = 0;
  for (int shift = 0; *p < end && shift < 64; shift += 7) {
    unsigned char b = *(*p)++;
    *v |= (unsigned long long)(b & 0x7f) << shift;
    if (!(b & 0x80)) return 0;
  }
  return -1;
}

/* The fields of LocalResponse (and of its hello and ticket) this probe reads. */
static int parse(const unsigned char *p, const unsigned char *end, int in, struct reply *r) {
  while (p < end) {
    unsigned long long key, v;
    if (varint(&p, end, &key)) return -1;
    int field = (int)(key >> 3), type = (int)(key & 7);
    if (type == 0) {
      if (varint(&p, end, &v)) return -1;
      if (in == 0 && field == 1) r->code = (long long)v;
      if (in == 3 && field == 2) r->uid = (long long)v;
      if (in == 3 && field == 3) r->gid = (long long)v;
      if (in == 3 && field == 4) r->pid = (long long)v;
      if (in == 4 && field == 2) r->object_bytes = (long long)v;
    } else if (type == 2) {
      if (varint(&p, end, &v) || v > (unsigned long long)(end - p)) return -1;
      char *text = in == 0 && field == 2 ? r->message : in == 4 && field == 1 ? r->ticket : NULL;
      size_t cap = text == r->message ? sizeof r->message : sizeof r->ticket;
      if (text != NULL) snprintf(text, cap, "%.*s", (int)v, (const char *)p);
      if (in == 0 && (field == 3 || field == 4) && parse(p, p + v, field, r)) return -1;
      p += v;
    } else if (type == 1 || type == 5) {
      p += type == 1 ? 8 : 4;
    } else {
      return -1;
    }
  }
  return 0;
}

static int call(int s, const unsigned char *body, size_t n, int pass, struct reply *r) {
  unsigned char len[4], buf[4096];
  memset(r, 0, sizeof *r);
  if (send_frame(s, body, n, pass) || read_all(s, len, 4)) return -1;
  size_t m = len[0] | (size_t)len[1] << 8 | (size_t)len[2] << 16 | (size_t)len[3] << 24;
  if (m > sizeof buf || read_all(s, buf, m)) return -1;
  return parse(buf, buf + m, 0, r);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SOCKET_PATH\n", argv[0]);
    return 2;
  }
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  snprintf(addr.sun_path, sizeof addr.sun_path, "%s", argv[1]);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr) != 0) {
    printf("connect: %s: %s\n", argv[1], strerror(errno));
    return 2;
  }
  struct reply r;
  static const unsigned char hello[] = {0x0a, 0x00}; /* LocalRequest{hello{}} */
  if (call(s, hello, sizeof hello, -1, &r)) {
    printf("hello: no reply\n");
    return 2;
  }
  printf("hello: code %lld uid %lld gid %lld pid %lld %s\n", r.code, r.uid, r.gid, r.pid, r.message);

  char key[64];
  snprintf(key, sizeof key, "/dgmm-deploy-probe-%d", (int)getpid());
  int fd = shm_open(key, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 || ftruncate(fd, 4096) != 0) {
    printf("shm_open %s: %s\n", key, strerror(errno));
    return 2;
  }
  unsigned char open_shm[80] = {0x1a, 0, 0x0a, 0}; /* LocalRequest{open_shm{key}} */
  size_t klen = strlen(key);
  open_shm[1] = (unsigned char)(klen + 2), open_shm[3] = (unsigned char)klen;
  memcpy(open_shm + 4, key, klen);
  int rc = call(s, open_shm, klen + 4, -1, &r);
  if (rc == 0) printf("open_shm: code %lld key %s %s\n", r.code, key, r.message);

  static const unsigned char pass_fd[] = {0x12, 0x02, 0x08, 0x01}; /* pass_fd{kind MEMORY} */
  if (rc == 0) rc = call(s, pass_fd, sizeof pass_fd, fd, &r);
  if (rc == 0) printf("pass_fd: code %lld ticket %s object_bytes %lld %s\n", r.code, r.ticket, r.object_bytes, r.message);
  shm_unlink(key);
  close(fd);
  close(s);
  if (rc != 0) printf("the server closed the connection or sent a bad frame\n");
  return rc == 0 ? 0 : 2;
}
