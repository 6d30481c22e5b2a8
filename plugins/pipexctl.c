/*
 * pipexctl.so -- a pppd plugin that takes its PPP channel from `pipexctl serve`.
 *
 * xl2tpd (userspace mode) starts pppd on a pty.  With `plugin pipexctl.so` in
 * pppd's options file, this plugin asks the pipexctl daemon (a unix socket,
 * root only) for the call's channel: a PPPoL2TP socket connected to a kernel
 * L2TP session that the daemon created for this pppd's call.  The socket
 * arrives over SCM_RIGHTS and becomes pppd's channel, so pppd never opens the
 * pty and PPP data goes UDP -> kernel -> pppN.  With it comes a copy of the
 * tunnel's UDP socket, which the plugin keeps for pppd's life: the kernel
 * tunnel then outlives a restart of the daemon.
 *
 * If the daemon is absent or refuses, the plugin logs why and pppd continues
 * on the pty, unless `pipexctl_required` is set: then pppd stops.  A call
 * left on the pty is moved into the kernel later, while it runs (a "live
 * move"): once LCP is up, a timer asks the daemon again every
 * `pipexctl_move` seconds (longer after a refusal); when the daemon gives a
 * channel, already under the ppp unit beside the pty's (the daemon put it
 * there as the session was made, so the peer's frames reach pppN from
 * then on), the plugin detaches the pty's channel (PPPIOCDISCONN) and pppd
 * sends down the kernel's: LCP, IPCP and the unit (pppN, its addresses)
 * stay as they are.  The same timer keeps a control link to the daemon,
 * over which the daemon may ask for any call, however it began, to be moved
 * back to its pty (for maintenance) and into the kernel again.
 *
 * Options (one table, below):
 *   pipexctl_socket PATH   the daemon's socket (default /run/pipexctl/serve.sock)
 *   pipexctl_timeout SECS  how long to wait for the daemon (default 5)
 *   pipexctl_required      fail instead of falling back to the pty
 *   pipexctl_compression   keep ACFC/PFC, VJ and CCP compression as the other
 *                          options say (default: off on the kernel channel,
 *                          as pppd's own pppol2tp.so turns them off)
 *   pipexctl_move SECS     a call left on the pty asks to be moved into the
 *                          kernel every SECS seconds (default 1; 0: never)
 *
 * Built against Debian's ppp-dev (pppd 2.4.9); the few API differences of
 * pppd 2.5 are behind PPP_API_25 (see plugins/Makefile).
 */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <sys/types.h>
#include <sys/un.h>
#include <dirent.h>
#include <unistd.h>
#include <linux/if_pppox.h>
#include <linux/ppp_defs.h>
#include <linux/ppp-ioctl.h>

#ifdef PPP_API_25
/* pppd 2.5 (Debian 13): renamed entry points; compiled against trixie's
 * ppp-dev headers by tests/unit/test_plugin_build.py */
#include <pppd/pppd.h>
#include <pppd/options.h>
#include <pppd/fsm.h>
#include <pppd/lcp.h>
#include <pppd/ipcp.h>
#include <pppd/ccp.h>
#define PX_VERSION PPPD_VERSION
typedef struct option px_option_t;
#define PX_IFNAME() ppp_ifname()
#define generic_establish_ppp ppp_generic_establish
#define generic_disestablish_ppp ppp_generic_disestablish
#define add_options ppp_add_options
#define PX_TIMEOUT ppp_timeout
#else
#include <pppd/pppd.h>
#include <pppd/fsm.h>
#include <pppd/lcp.h>
#include <pppd/ipcp.h>
#include <pppd/ccp.h>
#define PX_VERSION VERSION
typedef option_t px_option_t;
#define PX_IFNAME() ifname
#define PX_TIMEOUT timeout
#endif

char pppd_version[] = PX_VERSION;

/* a static buffer (OPT_STATIC): pppd frees a non-static o_string's old value */
static char px_socket[108] = "/run/pipexctl/serve.sock";
static int px_timeout = 5;
static bool px_required = 0;
static bool px_compression = 0;
static int px_move_every = 1;

static px_option_t px_options[] = {
	{ "pipexctl_socket", o_string, px_socket,
	  "Unix socket of pipexctl serve", OPT_PRIO | OPT_PRIV | OPT_STATIC, NULL, sizeof(px_socket) },
	{ "pipexctl_timeout", o_int, &px_timeout,
	  "Seconds to wait for pipexctl serve", OPT_PRIO | OPT_PRIV | OPT_LIMITS, NULL, 60, 1 },
	{ "pipexctl_required", o_bool, &px_required,
	  "Fail when pipexctl cannot provide the channel", OPT_PRIO | OPT_PRIV | 1 },
	{ "pipexctl_compression", o_bool, &px_compression,
	  "Keep ACFC/PFC, VJ and CCP compression on the kernel channel", OPT_PRIO | OPT_PRIV | 1 },
	{ "pipexctl_move", o_int, &px_move_every,
	  "Seconds between asks to move a pty call into the kernel (0: never)",
	  OPT_PRIO | OPT_PRIV | OPT_LIMITS, NULL, 3600, 0 },
	{ NULL }
};

static struct channel *px_fallback;	/* the channel pppd had (tty) */
static int px_fd = -1;			/* the PPPoL2TP socket */
static int px_tunnel_fd = -1;		/* a copy of the tunnel's UDP socket */
static int px_nokernel;			/* errno of the PPPoL2TP probe at load (0: fine) */
static int px_pty_chan = -1;		/* after a live move: the pty's channel, detached */
static int px_tty = -1;			/* offloaded at pppd's start: the pty, kept for a move back */
/* CLOCK_MONOTONIC (ns) when the last ask began and when its reply was read:
 * sent back in the ack, so the daemon's log splits the hand-off between its
 * own threads and this pppd's scheduling (the clock is one per machine) */
static long long px_t_asked, px_t_read;
/* this thread's time runnable and waiting for a CPU (ns) at those two points:
 * the kernel's schedstat tells the daemon how much of the ask was pppd's own
 * wait for a CPU on a busy machine (-1: not known, and not sent) */
static long long px_q_asked = -1, px_q_read = -1;

static long long px_runq_ns(void)
{
	char buf[96];
	unsigned long long run, wait;
	ssize_t n;
	int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	if (sscanf(buf, "%llu %llu", &run, &wait) != 2 || wait > (unsigned long long)LLONG_MAX)
		return -1;
	return (long long)wait;
}

static long long px_ns(void)
{
	struct timespec t;

	if (clock_gettime(CLOCK_MONOTONIC, &t) < 0)
		return 0;	/* the daemon takes no stamp of 0 */
	return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Read the whole reply line and the (up to two) fds that came with it. */
static int px_recv(int s, char *buf, size_t len, int fds[2])
{
	struct msghdr msg;
	struct iovec iov;
	union { struct cmsghdr h; char b[CMSG_SPACE(2 * sizeof(int))]; } ctl;
	struct cmsghdr *c;
	struct pollfd p = { .fd = s, .events = POLLIN };
	ssize_t n;
	size_t k;

	fds[0] = fds[1] = -1;
	if (poll(&p, 1, px_timeout * 1000) != 1) {
		errno = ETIMEDOUT;
		return -1;
	}
	memset(&msg, 0, sizeof(msg));
	iov.iov_base = buf;
	iov.iov_len = len - 1;
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = ctl.b;
	msg.msg_controllen = sizeof(ctl.b);
	n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
	if (n <= 0) {
		if (n == 0)
			errno = ECONNRESET;
		return -1;
	}
	buf[n] = 0;
	for (c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		if (k > 2)
			k = 2;	/* MSG_CTRUNC: the kernel closed any beyond our buffer */
		memcpy(fds, CMSG_DATA(c), k * sizeof(int));
	}
	return 0;
}

/* Is fd a connected UDP socket (the tunnel's)? */
static int px_is_tunnel_socket(int fd)
{
	int type = 0, domain = 0;
	socklen_t l = sizeof(int);
	struct sockaddr_storage peer;
	socklen_t plen = sizeof(peer);

	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) < 0 || type != SOCK_DGRAM)
		return 0;
	l = sizeof(int);
	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &l) < 0 ||
	    (domain != AF_INET && domain != AF_INET6))
		return 0;
	return getpeername(fd, (struct sockaddr *)&peer, &plen) == 0;
}

/* Send the request; with it the pty xl2tpd gave us (fd 0), if any.  The
 * daemon keeps the pty open and drained for the life of the call: if nobody
 * held it, xl2tpd would read EIO from its master end in a busy loop. */
static ssize_t px_send(int s, const char *req, int fd)
{
	struct msghdr msg;
	struct iovec iov;
	union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int))]; } ctl;
	struct cmsghdr *c;

	memset(&msg, 0, sizeof(msg));
	iov.iov_base = (void *)req;
	iov.iov_len = strlen(req);
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	if (fd >= 0) {
		memset(&ctl, 0, sizeof(ctl));
		msg.msg_control = ctl.b;
		msg.msg_controllen = sizeof(ctl.b);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	return sendmsg(s, &msg, MSG_NOSIGNAL);
}

/* A number after "key": in the daemon's one-line JSON reply, or -1. */
static long px_json_int(const char *buf, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(buf, pat);
	if (!p)
		return -1;
	p += strlen(pat);
	while (*p == ' ')
		p++;
	return strtol(p, NULL, 10);
}

/* The daemon's refusal, for pppd's log: the JSON string after "error":
 * up to its closing quote, at most 200 characters, anything but printable
 * ASCII shown as '?' (the text must not write lines of its own into the log). */
static void px_refusal(char *dst, size_t len, const char *rep)
{
	const char *e = strstr(rep, "\"error\": \"");
	size_t n;

	if (!e) {
		snprintf(dst, len, "pipexctl refused: unreadable reply");
		return;
	}
	n = snprintf(dst, len, "pipexctl refused: ");
	if (n >= len)
		return;
	for (e += 10; *e && *e != '"' && n + 1 < len && n < 218; e++) {
		if (*e == '\\' && e[1])
			e++;
		dst[n++] = (*e >= 0x20 && *e < 0x7f) ? *e : '?';
	}
	dst[n] = 0;
}

/* connect(), bounded by pipexctl_timeout: a daemon that cannot accept
 * (its backlog full) would otherwise hold pppd in connect() for ever. */
static int px_connect_timeout(int s, const struct sockaddr_un *sa)
{
	struct pollfd p = { .fd = s, .events = POLLOUT };
	int flags = fcntl(s, F_GETFL), err = 0;
	socklen_t l = sizeof(err);

	if (flags < 0 || fcntl(s, F_SETFL, flags | O_NONBLOCK) < 0)
		return -1;
	if (connect(s, (const struct sockaddr *)sa, sizeof(*sa)) < 0) {
		if (errno != EINPROGRESS && errno != EAGAIN)
			return -1;
		if (poll(&p, 1, px_timeout * 1000) != 1) {
			errno = ETIMEDOUT;
			return -1;
		}
		if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l) < 0)
			return -1;
		if (err) {
			errno = err;
			return -1;
		}
	}
	return fcntl(s, F_SETFL, flags);
}

/* px_ask's results beyond 0 (a channel, checked) */
#define PX_UNREACHED	-1	/* no daemon, or no reply: ask again soon */
#define PX_REFUSED	-2	/* the daemon said no: ask again later */
#define PX_FINAL	-3	/* the daemon said no for good ("retry": false) */

/* Ask the daemon for a channel: op "channel" at pppd's start (with the pty
 * as SCM_RIGHTS) or "move" for a call running on its pty (``unit``: its
 * ppp unit, for the daemon to put the channel under; -1: none).  On success the
 * connection stays open in *conn, not yet acknowledged, with the PPPoL2TP
 * socket in *fd (checked: bound to the session the reply names) and the
 * tunnel's socket copy in *tfd; rep holds the reply line. */
static int px_ask(const char *op, int with_pty, int unit, int *conn, int *fd, int *tfd, char *rep, size_t replen,
		  char *why, size_t whylen)
{
	struct sockaddr_un sa;
	char req[128];
	int s, fds[2], ret = PX_UNREACHED;
	long sid, tid;
	struct sockaddr_storage addr;
	socklen_t alen = sizeof(addr);
	struct stat st;

	*conn = *fd = *tfd = -1;
	px_t_asked = px_ns();
	px_q_asked = px_runq_ns();
	px_t_read = 0;
	px_q_read = -1;
	s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0) {
		snprintf(why, whylen, "socket: %s", strerror(errno));
		return PX_UNREACHED;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	if (strlen(px_socket) >= sizeof(sa.sun_path)) {
		snprintf(why, whylen, "socket path too long");
		close(s);
		return PX_FINAL;
	}
	strcpy(sa.sun_path, px_socket);
	if (px_connect_timeout(s, &sa) < 0) {
		snprintf(why, whylen, "cannot reach %s: %s", px_socket, strerror(errno));
		close(s);
		return PX_UNREACHED;
	}
	/* the daemon identifies us by SO_PEERCRED; the pid here is informational.
	 * v 3: a move waits for the daemon's commit after its ack; v 4: it names its unit */
	if (unit >= 0)
		snprintf(req, sizeof(req), "{\"op\": \"%s\", \"v\": 4, \"pid\": %d, \"unit\": %d}\n", op,
			 (int)getpid(), unit);
	else
		snprintf(req, sizeof(req), "{\"op\": \"%s\", \"v\": %d, \"pid\": %d}\n", op, with_pty ? 2 : 4,
			 (int)getpid());
	if (px_send(s, req, with_pty && isatty(0) ? 0 : -1) != (ssize_t)strlen(req)) {
		snprintf(why, whylen, "write to %s: %s", px_socket, strerror(errno));
		close(s);
		return PX_UNREACHED;
	}
	if (px_recv(s, rep, replen, fds) < 0) {
		snprintf(why, whylen, "no reply from %s: %s", px_socket, strerror(errno));
		close(s);
		return PX_REFUSED;	/* a daemon that does not answer in time is busy: ask it less often */
	}
	px_q_read = px_runq_ns();	/* first: a wait after the read's stamp would not fit its span */
	px_t_read = px_ns();
	ret = PX_REFUSED;
	/* the contract: the reply is one JSON object whose first member is "ok" */
	if (fds[1] >= 0 && !px_is_tunnel_socket(fds[1]))
		snprintf(why, whylen, "second fd of the reply is not a connected UDP socket");
	else if (strncmp(rep, "{\"ok\": true,", 12) != 0) {
		px_refusal(why, whylen, rep);
		if (strstr(rep, "\"retry\": false"))
			ret = PX_FINAL;
	} else {
		/* validate before use: a PPPoX socket bound to the session we were told */
		sid = px_json_int(rep, "session_id");
		tid = px_json_int(rep, "tunnel_id");
		memset(&addr, 0, sizeof(addr));
		if (fds[0] < 0 || fstat(fds[0], &st) < 0 || !S_ISSOCK(st.st_mode))
			snprintf(why, whylen, "reply carried no socket");
		else if (getsockname(fds[0], (struct sockaddr *)&addr, &alen) < 0 || addr.ss_family != AF_PPPOX)
			snprintf(why, whylen, "received fd is not an AF_PPPOX socket");
		else if (alen != sizeof(struct sockaddr_pppol2tp))
			snprintf(why, whylen, "received socket is not an L2TPv2 session over IPv4");
		else if (sid <= 0 || tid <= 0)
			snprintf(why, whylen, "reply has no tunnel or session id");
		else if (((struct sockaddr_pppol2tp *)&addr)->pppol2tp.s_session != sid ||
			 ((struct sockaddr_pppol2tp *)&addr)->pppol2tp.s_tunnel != tid)
			snprintf(why, whylen, "received socket is session %u/%u, the reply says %ld/%ld",
				 ((struct sockaddr_pppol2tp *)&addr)->pppol2tp.s_tunnel,
				 ((struct sockaddr_pppol2tp *)&addr)->pppol2tp.s_session, tid, sid);
		else {
			*conn = s;
			*fd = fds[0];
			*tfd = fds[1];
			return 0;
		}
	}
	/* not taken: the daemon undoes whatever it made, for want of our ack */
	if (fds[0] >= 0)
		close(fds[0]);
	if (fds[1] >= 0)
		close(fds[1]);
	close(s);
	return ret;
}

/* The daemon undoes the offload unless we acknowledge what we checked.
 * The times are for its log only (a daemon before them ignores them). */
static int px_ack(int s, char *why, size_t whylen)
{
	char line[192];
	int n;
	ssize_t w;

	if (px_q_asked >= 0 && px_q_read >= px_q_asked)
		n = snprintf(line, sizeof(line),
			     "{\"op\": \"ack\", \"asked_ns\": %lld, \"read_ns\": %lld, \"ack_ns\": %lld, \"cpu_wait_ns\": %lld}\n",
			     px_t_asked, px_t_read, px_ns(), px_q_read - px_q_asked);
	else
		n = snprintf(line, sizeof(line), "{\"op\": \"ack\", \"asked_ns\": %lld, \"read_ns\": %lld, \"ack_ns\": %lld}\n",
			     px_t_asked, px_t_read, px_ns());
	if (n <= 0 || (size_t)n >= sizeof(line))
		errno = EMSGSIZE;
	else if ((w = send(s, line, n, MSG_NOSIGNAL)) == n)
		return 0;
	else if (w >= 0)
		errno = EIO;	/* a short send on a stream socket we just connected */
	snprintf(why, whylen, "cannot acknowledge the channel: %s", strerror(errno));
	return -1;
}

static void px_took(const char *rep)
{
	info("pipexctl: kernel channel for tunnel %ld session %ld (peer %ld/%ld)",
	     px_json_int(rep, "tunnel_id"), px_json_int(rep, "session_id"),
	     px_json_int(rep, "peer_tunnel_id"), px_json_int(rep, "peer_session_id"));
}

/* At pppd's start: ask for our channel; 0 and px_fd set on success. */
static int px_request(char *why, size_t whylen)
{
	char rep[1024];
	int s, fd, tfd;

	if (px_ask("channel", 1, -1, &s, &fd, &tfd, rep, sizeof(rep), why, whylen) < 0)
		return -1;
	if (px_ack(s, why, whylen) < 0) {
		close(s);
		close(fd);
		if (tfd >= 0)
			close(tfd);
		return -1;
	}
	close(s);
	px_fd = fd;
	px_tunnel_fd = tfd;
	px_took(rep);
	return 0;
}

/* ---- the live move: a running call's channel, pty -> kernel */

/* pppd's /dev/ppp fds: the unit's (PPPIOCGUNIT answers) and the channel's
 * (it does not: the ioctl goes to the channel, which knows no such thing).
 * pppd 2.5 exports neither fd, so both are found by looking, leaving out
 * ``skip`` (the channel being switched to); ``seen`` says what was found
 * when it is not one of each. */
static int px_ppp_fds(int skip, int *chan, int *unit, char *seen, size_t seenlen)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	struct stat st;
	int fd, u, nchan = 0, nunit = 0;
	size_t n = 0;

	*chan = *unit = -1;
	seen[0] = 0;
	if (!d) {
		snprintf(seen, seenlen, "/proc/self/fd: %s", strerror(errno));
		return -1;
	}
	while ((e = readdir(d)) != NULL) {
		fd = atoi(e->d_name);
		if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == dirfd(d) || fd == skip)
			continue;
		if (fstat(fd, &st) < 0 || !S_ISCHR(st.st_mode) || major(st.st_rdev) != 108)
			continue;	/* 108: PPP_MAJOR, /dev/ppp */
		if (ioctl(fd, PPPIOCGUNIT, &u) == 0) {
			*unit = u;
			nunit++;
			if (n < seenlen)
				n += snprintf(seen + n, seenlen - n, " fd %d: unit %d;", fd, u);
		} else {
			if (n < seenlen)
				n += snprintf(seen + n, seenlen - n, " fd %d: %s;", fd, strerror(errno));
			*chan = fd;
			nchan++;
		}
	}
	closedir(d);
	return nchan == 1 && nunit == 1 ? 0 : -1;
}

/* The unit may hold a frame for the channel just detached, its queue
 * stopped until that channel calls it back, which it never will now (a pty
 * kept busy by a transfer): pppN would send nothing more until pppd wrote
 * to the unit.  A frame written on the new channel makes the unit send
 * again: an LCP Discard-Request, which the peer drops (RFC 1661, 5.8). */
static void px_kick(int chan, int unit)
{
	u_int32_t m = lcp_gotoptions[0].neg_magicnumber ? lcp_gotoptions[0].magicnumber : 0;
	unsigned char f[10] = { 0xc0, 0x21, 11, 0, 0, 8, m >> 24, m >> 16, m >> 8, m };

	if (write(chan, f, sizeof(f)) != (ssize_t)sizeof(f))
		warn("pipexctl: cannot write the Discard-Request that restarts ppp%d's sending: %m", unit);
}

/* Put the channel of ``to`` (a /dev/ppp channel file) under pppd's unit in
 * place of the one on pppd's channel fd, in one step as pppd's main loop
 * sees it: ``to`` takes that fd's number, which pppd reads control frames
 * from and writes them to.  ``joined``: ``to``'s channel is under the unit
 * already (the daemon put it there).  The new channel is connected before
 * the old one is detached: the unit sends down its first channel, so the
 * old one carries until then, and a failure leaves the old one in place.
 * Returns the old channel's file (detached, close-on-exec), or -1 and why
 * with pppd's channel unchanged. */
static int px_switch(int to, int joined, char *why, size_t whylen)
{
	int chan, unit, old, n = 0;
	char buf[2048], seen[160];

	if (px_ppp_fds(to, &chan, &unit, seen, sizeof(seen)) < 0) {
		snprintf(why, whylen, "cannot tell pppd's channel and unit among its /dev/ppp fds:%s", seen);
		return -1;
	}
	if (!joined && ioctl(to, PPPIOCCONNECT, &unit) < 0) {
		snprintf(why, whylen, "cannot connect the channel to ppp%d: %s", unit, strerror(errno));
		return -1;
	}
	if (ioctl(chan, PPPIOCDISCONN) < 0) {
		snprintf(why, whylen, "PPPIOCDISCONN on pppd's channel: %s", strerror(errno));
		ioctl(to, PPPIOCDISCONN);
		return -1;
	}
	/* what reached the channel before it was under the unit waits on it
	 * (and control frames since); pppd would answer data frames with LCP
	 * Protocol-Rejects (which close the peer's IPCP): drop them */
	while (read(to, buf, sizeof(buf)) > 0)
		n++;
	old = fcntl(chan, F_DUPFD_CLOEXEC, 3);
	if (old < 0 || dup2(to, chan) < 0)
		fatal("pipexctl: cannot put the new channel on fd %d: %m", chan);
	fcntl(chan, F_SETFD, FD_CLOEXEC);
	close(to);
	px_kick(chan, unit);
	if (n)
		dbglog("pipexctl: %d frame(s) that came before the switch dropped", n);
	return old;
}

/* pty -> kernel: the PPPoL2TP socket's channel under the unit (``joined``:
 * the daemon put it there); the pty's channel is kept, detached, for a
 * move back. */
static int px_swap(int sock, int joined, char *why, size_t whylen)
{
	int idx, nfd, old;

	if (ioctl(sock, PPPIOCGCHAN, &idx) < 0) {
		snprintf(why, whylen, "PPPIOCGCHAN on the PPPoL2TP socket: %s", strerror(errno));
		return -1;
	}
	nfd = open("/dev/ppp", O_RDWR | O_CLOEXEC | O_NONBLOCK);
	if (nfd < 0 || ioctl(nfd, PPPIOCATTCHAN, &idx) < 0) {
		snprintf(why, whylen, "cannot attach to channel %d: %s", idx, strerror(errno));
		if (nfd >= 0)
			close(nfd);
		return -1;
	}
	old = px_switch(nfd, joined, why, whylen);
	if (old < 0) {
		close(nfd);
		return -1;
	}
	px_pty_chan = old;
	return 0;
}

/* A call offloaded at pppd's start never had a pty channel: make one as
 * pppd's tty channel would have, the pty raw under PPP's async line
 * discipline, sending with the ACCM the peer asked for.  Returns its
 * /dev/ppp channel file (not under the unit), or -1 and why with the pty
 * left as it was. */
static int px_pty_attach(char *why, size_t whylen)
{
	struct termios t;
	int disc = N_PPP, tty_disc = N_TTY, idx, fd = -1;
	int accm = lcp_hisoptions[0].neg_asyncmap ? (int)lcp_hisoptions[0].asyncmap : -1;
	int mru = lcp_gotoptions[0].neg_mru ? lcp_gotoptions[0].mru : PPP_MRU;

	if (tcgetattr(px_tty, &t) == 0) {
		cfmakeraw(&t);
		tcsetattr(px_tty, TCSANOW, &t);
	}
	if (ioctl(px_tty, TIOCSETD, &disc) < 0) {
		snprintf(why, whylen, "cannot put the pty under PPP's line discipline: %s", strerror(errno));
		return -1;
	}
	if (ioctl(px_tty, PPPIOCGCHAN, &idx) < 0 ||
	    (fd = open("/dev/ppp", O_RDWR | O_CLOEXEC | O_NONBLOCK)) < 0 ||
	    ioctl(fd, PPPIOCATTCHAN, &idx) < 0 ||
	    ioctl(fd, PPPIOCSASYNCMAP, &accm) < 0 ||
	    (mru > PPP_MRU && ioctl(fd, PPPIOCSMRU, &mru) < 0)) {
		snprintf(why, whylen, "cannot make the pty's channel: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		ioctl(px_tty, TIOCSETD, &tty_disc);
		return -1;
	}
	return fd;
}

/* kernel -> pty, on the daemon's word: the pty's channel back under the
 * unit, then the session's socket closed (the kernel deletes the session;
 * what the peer sends for it goes to xl2tpd again, through the daemon's
 * relay while the tunnel stays). */
static int px_unmove(char *why, size_t whylen)
{
	int kern, made = 0, tty_disc = N_TTY;

	if (px_fd < 0) {
		snprintf(why, whylen, "the call is not in the kernel");
		return -1;
	}
	if (px_pty_chan < 0) {
		if (px_tty < 0) {
			snprintf(why, whylen, "offloaded at pppd's start with no pty to go back to");
			return -1;
		}
		if ((px_pty_chan = px_pty_attach(why, whylen)) < 0)
			return -1;
		made = 1;
	}
	kern = px_switch(px_pty_chan, 0, why, whylen);
	if (kern < 0) {
		if (made) {	/* the pty back as it was, for the daemon's drain */
			close(px_pty_chan);
			px_pty_chan = -1;
			ioctl(px_tty, TIOCSETD, &tty_disc);
		}
		return -1;
	}
	px_pty_chan = -1;
	close(kern);
	close(px_fd);
	px_fd = -1;
	if (px_tunnel_fd >= 0)
		close(px_tunnel_fd);
	px_tunnel_fd = -1;
	return 0;
}

/* Move this running call into the kernel: 0, or a PX_ result and why. */
static int px_move(char *why, size_t whylen)
{
	char rep[1024], line[256], seen[160];
	int s, fd, tfd, r, none[2], chan, unit;

	/* our unit, for the daemon to put the channel under: none found, the
	 * daemon does not, and the swap below says why it cannot either */
	if (px_ppp_fds(-1, &chan, &unit, seen, sizeof(seen)) < 0)
		unit = -1;
	r = px_ask("move", 0, unit, &s, &fd, &tfd, rep, sizeof(rep), why, whylen);
	if (r < 0)
		return r;
	/* the daemon commits only what we acknowledged, and says so: a channel
	 * whose offload the daemon gave up on (its ack timeout) is never used */
	r = px_ack(s, why, whylen);
	if (r == 0 && px_recv(s, line, sizeof(line), none) < 0) {
		snprintf(why, whylen, "no commit from %s: %s", px_socket, strerror(errno));
		r = -1;
	} else if (r == 0 && strncmp(line, "{\"ok\": true, \"committed\": true", 30) != 0) {
		px_refusal(why, whylen, line);
		r = -1;
	}
	if (r == 0)
		r = px_swap(fd, unit >= 0 && px_json_int(rep, "unit") == unit, why, whylen);
	close(s);
	if (r < 0) {
		close(fd);	/* the kernel deletes the session with it */
		if (tfd >= 0)
			close(tfd);
		return PX_REFUSED;
	}
	px_fd = fd;
	px_tunnel_fd = tfd;
	px_took(rep);
	return 0;
}

/* ---- the control link: a connection the daemon keeps to this pppd for the
 * call's life, over which it may ask for a move back to the pty ("undo") or
 * forward again ("move").  Read by the
 * timer below, without blocking; reopened after a daemon restart. */

static int px_link = -1;
static int px_link_refused;	/* the daemon will never take this pppd */
static int px_hold;		/* moved back on the daemon's word: no asking until it says "move" */
static int px_asap;		/* the daemon said "move": ask at the next tick, whatever the backoff */
static char px_linebuf[512];
static size_t px_linelen;

static void px_link_close(void)
{
	if (px_link >= 0)
		close(px_link);
	px_link = -1;
	px_linelen = 0;
	px_hold = 0;	/* a new daemon decides anew */
}

static void px_link_open(void)
{
	struct sockaddr_un sa;
	char hello[96];
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (s < 0)
		return;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", px_socket);
	snprintf(hello, sizeof(hello), "{\"op\": \"link\", \"v\": 3, \"pid\": %d}\n", (int)getpid());
	if (px_connect_timeout(s, &sa) < 0 ||
	    send(s, hello, strlen(hello), MSG_NOSIGNAL) != (ssize_t)strlen(hello)) {
		close(s);
		return;
	}
	px_link = s;
	dbglog("pipexctl: control link to %s open", px_socket);
}

static void px_link_say(const char *msg)
{
	if (px_link >= 0 && send(px_link, msg, strlen(msg), MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
		px_link_close();
}

static void px_link_line(const char *line)
{
	char why[320], rep[400];

	if (strcmp(line, "{\"op\": \"undo\"}") == 0) {
		if (px_unmove(why, sizeof(why)) == 0) {
			px_hold = 1;
			info("pipexctl: call moved back from the kernel to the pty (the daemon asked)");
			px_link_say("{\"op\": \"undone\"}\n");
		} else {
			warn("pipexctl: not moved back to the pty: %s", why);
			snprintf(rep, sizeof(rep), "{\"op\": \"not_undone\", \"error\": \"%s\"}\n", why);
			px_link_say(rep);
		}
	} else if (strcmp(line, "{\"op\": \"move\"}") == 0) {
		px_hold = 0;
		px_asap = 1;
	} else if (strncmp(line, "{\"ok\": false,", 13) == 0) {
		if (strstr(line, "\"retry\": false"))
			px_link_refused = 1;	/* not xl2tpd's pppd: never again */
		px_link_close();
	}
	/* {"ok": true}: the daemon took the link */
}

static void px_link_read(void)
{
	ssize_t n;
	char *nl;

	for (;;) {
		n = recv(px_link, px_linebuf + px_linelen, sizeof(px_linebuf) - 1 - px_linelen, MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
			px_link_close();
			return;
		}
		if (n < 0)
			return;
		px_linelen += n;
		px_linebuf[px_linelen] = 0;
		while ((nl = strchr(px_linebuf, '\n')) != NULL) {
			*nl = 0;
			px_link_line(px_linebuf);
			if (px_link < 0)
				return;
			px_linelen -= nl + 1 - px_linebuf;
			memmove(px_linebuf, nl + 1, px_linelen + 1);
		}
		if (px_linelen >= sizeof(px_linebuf) - 1) {	/* no line fits: not our daemon */
			px_link_close();
			return;
		}
	}
}

static long px_now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec;
}

/* While there is nothing to ask for (the call in the kernel, or held on its
 * pty), the timer only reads the control link: every 5 s rather than every
 * second in each of thousands of offloaded pppds (the operator's move waits
 * 15 s for the plugins' answers). */
#define PX_LINK_EVERY 5

/* pppd's timer, every pipexctl_move seconds for the call's life (however it
 * began): keep the control link and act on it; while the call
 * is on its pty (and the daemon did not move it back), ask to be moved once
 * LCP is up: again at the next tick while no daemon answers, and after a
 * refusal at growing intervals (5 s to 5 minutes), so that thousands of pty
 * calls cost a daemon that refuses them little. */
static void px_tick(void *arg)
{
	static char last[320];
	static int backoff, no_pfc;
	static long next;
	char why[320];
	int r, quiet = px_fd >= 0 || px_hold || no_pfc;

	(void)arg;
	if (px_link_refused)
		return;	/* the daemon will never take this pppd: no more ticks */
	PX_TIMEOUT(px_tick, NULL, quiet && px_move_every < PX_LINK_EVERY ? PX_LINK_EVERY : px_move_every, 0);
	if (lcp_fsm[0].state != OPENED)
		return;
	if (px_link < 0)
		px_link_open();
	if (px_link >= 0)
		px_link_read();
	if (px_fd >= 0 || px_hold || no_pfc || px_link_refused || (!px_asap && px_now() < next))
		return;
	px_asap = 0;
	if (lcp_gotoptions[0].neg_pcompression) {
		/* the kernel channel takes no compressed protocol field */
		warn("pipexctl: the peer sends compressed protocol fields (PFC): this call stays on the pty");
		no_pfc = 1;
		return;
	}
	r = px_move(why, sizeof(why));
	if (r == 0) {
		info("pipexctl: call moved from the pty into the kernel");
		backoff = 0;
		last[0] = 0;
		return;
	}
	if (strcmp(why, last) != 0) {	/* each new reason once, not every second */
		warn("pipexctl: not moved into the kernel: %s", why);
		snprintf(last, sizeof(last), "%s", why);
	}
	if (r == PX_FINAL) {
		px_link_refused = 1;
		px_link_close();
		return;
	}
	backoff = r == PX_UNREACHED ? 0 : backoff ? backoff * 2 : 5;
	if (backoff > 300)
		backoff = 300;
	next = px_now() + backoff;
}

static void px_process_extra_options(void)
{
	if (px_fallback && px_fallback->process_extra_options)
		px_fallback->process_extra_options();
}

/* xl2tpd hands pppd the pty as stdin/stdout; with a kernel channel pppd
 * must not keep it: point those fds at /dev/null.  (The daemon holds the
 * slave end, drained, so xl2tpd's select() on the master does not spin.) */
static void px_release_pty(void)
{
	int fd, nul = open("/dev/null", O_RDWR | O_CLOEXEC);

	if (nul < 0)
		return;
	for (fd = 0; fd <= 1; fd++)
		if (isatty(fd))
			dup2(nul, fd);
	if (nul > 2)
		close(nul);
}

/* The kernel channel is synchronous and carries frames as they are, as
 * pppd's pppol2tp.so channel does: negotiate no header or data compression
 * (with pppd's stock options Deflate and VJ were negotiated, and transfers
 * through the offload stalled). */
static void px_no_compression(void)
{
	if (px_compression) {
		info("pipexctl: compression as the options say (pipexctl_compression)");
		return;
	}
	lcp_wantoptions[0].neg_accompression = lcp_allowoptions[0].neg_accompression = 0;
	lcp_wantoptions[0].neg_pcompression = lcp_allowoptions[0].neg_pcompression = 0;
	ipcp_wantoptions[0].neg_vj = ipcp_allowoptions[0].neg_vj = 0;
	ccp_wantoptions[0].deflate = ccp_allowoptions[0].deflate = 0;
	ccp_wantoptions[0].bsd_compress = ccp_allowoptions[0].bsd_compress = 0;
	info("pipexctl: ACFC, PFC, VJ and CCP compression off on the kernel channel");
}

static void px_check_options(void)
{
	char why[320];

	if (px_nokernel)
		snprintf(why, sizeof(why), "kernel has no PPPoL2TP (modprobe l2tp_ppp): %s", strerror(px_nokernel));
	else if (px_request(why, sizeof(why)) == 0) {
		/* the pty stays open here too (the daemon drains it): the way
		 * back to it, should the daemon ask over the control link */
		if (isatty(0))
			px_tty = fcntl(0, F_DUPFD_CLOEXEC, 3);
		px_release_pty();
		px_no_compression();
		if (px_move_every)
			PX_TIMEOUT(px_tick, NULL, px_move_every, 0);
		return;
	}
	if (px_required)
		fatal("pipexctl: %s (pipexctl_required is set)", why);
	warn("pipexctl: %s; continuing on the pty", why);
	if (px_move_every && !px_nokernel) {
		/* the call is to be moved into the kernel: negotiated as a call
		 * offloaded at pppd's start is (no compression, unless
		 * pipexctl_compression), and in any case with no compressed
		 * protocol field from the peer, which the kernel channel cannot
		 * take (the kernel sends it whole, which any peer accepts) */
		px_no_compression();
		lcp_wantoptions[0].neg_pcompression = 0;
		PX_TIMEOUT(px_tick, NULL, px_move_every, 0);
	}
	the_channel = px_fallback;
	if (the_channel->check_options)
		the_channel->check_options();
}

static int px_connect(void)
{
	if (px_fd < 0) {
		error("pipexctl: no kernel channel");
		return -1;
	}
	return px_fd;
}

static void px_disconnect(void)
{
	/* the session first (closing its socket deletes it), then our hold on the tunnel */
	if (px_fd >= 0) {
		close(px_fd);
		px_fd = -1;
	}
	if (px_tunnel_fd >= 0) {
		close(px_tunnel_fd);
		px_tunnel_fd = -1;
	}
}

static void px_send_config(int mtu, u_int32_t accm, int pcomp, int accomp)
{
	struct ifreq ifr;
	int fd;

	(void)accm; (void)pcomp; (void)accomp;
	fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	memset(&ifr, 0, sizeof(ifr));
	strncpy(ifr.ifr_name, PX_IFNAME(), sizeof(ifr.ifr_name) - 1);
	ifr.ifr_mtu = mtu;
	if (ioctl(fd, SIOCSIFMTU, &ifr) < 0)
		error("pipexctl: cannot set MTU %d on %s: %m", mtu, PX_IFNAME());
	close(fd);
}

static void px_recv_config(int mru, u_int32_t accm, int pcomp, int accomp)
{
	(void)mru; (void)accm; (void)pcomp; (void)accomp;
}

static void px_close(void)
{
	/* in forked children (scripts): they must not hold the channel */
	if (px_fd >= 0)
		close(px_fd);
	if (px_tunnel_fd >= 0)
		close(px_tunnel_fd);
	if (px_pty_chan >= 0)
		close(px_pty_chan);
	if (px_tty >= 0)
		close(px_tty);
	if (px_link >= 0)
		close(px_link);
}

static struct channel px_channel = {
	.options = NULL,
	.process_extra_options = px_process_extra_options,
	.check_options = px_check_options,
	.connect = px_connect,
	.disconnect = px_disconnect,
	.establish_ppp = generic_establish_ppp,
	.disestablish_ppp = generic_disestablish_ppp,
	.send_config = px_send_config,
	.recv_config = px_recv_config,
	.cleanup = NULL,
	.close = px_close,
};

void plugin_init(void)
{
	int s;

	/* probe the kernel at load: without PPPoL2TP there is nothing to offer.
	 * The verdict waits for check_options: pipexctl_required is not parsed yet */
	s = socket(AF_PPPOX, SOCK_DGRAM, PX_PROTO_OL2TP);
	if (s < 0)
		px_nokernel = errno ? errno : EAFNOSUPPORT;
	else
		close(s);
	add_options(px_options);
	px_fallback = the_channel;
	/* pppd looks every later option up in the_channel->options as well:
	 * NULL there crashed pppd (SIGSEGV in find_option) on any protocol
	 * option after the plugin line, and an empty table would refuse the
	 * tty options ("asyncmap", "crtscts") that the fallback channel needs */
	px_channel.options = px_fallback->options;
	the_channel = &px_channel;
}
