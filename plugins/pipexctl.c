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
 * on the pty, unless `pipexctl_required` is set: then pppd stops.
 *
 * Options (one table, below):
 *   pipexctl_socket PATH   the daemon's socket (default /run/pipexctl/serve.sock)
 *   pipexctl_timeout SECS  how long to wait for the daemon (default 5)
 *   pipexctl_required      fail instead of falling back to the pty
 *   pipexctl_compression   keep ACFC/PFC, VJ and CCP compression as the other
 *                          options say (default: off on the kernel channel,
 *                          as pppd's own pppol2tp.so turns them off)
 *
 * Built against Debian's ppp-dev (pppd 2.4.9); the few API differences of
 * pppd 2.5 are behind PPP_API_25 (see plugins/Makefile).
 */

#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>
#include <linux/if_pppox.h>
#include <linux/ppp_defs.h>

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
#else
#include <pppd/pppd.h>
#include <pppd/fsm.h>
#include <pppd/lcp.h>
#include <pppd/ipcp.h>
#include <pppd/ccp.h>
#define PX_VERSION VERSION
typedef option_t px_option_t;
#define PX_IFNAME() ifname
#endif

char pppd_version[] = PX_VERSION;

/* a static buffer (OPT_STATIC): pppd frees a non-static o_string's old value */
static char px_socket[108] = "/run/pipexctl/serve.sock";
static int px_timeout = 5;
static bool px_required = 0;
static bool px_compression = 0;

static px_option_t px_options[] = {
	{ "pipexctl_socket", o_string, px_socket,
	  "Unix socket of pipexctl serve", OPT_PRIO | OPT_PRIV | OPT_STATIC, NULL, sizeof(px_socket) },
	{ "pipexctl_timeout", o_int, &px_timeout,
	  "Seconds to wait for pipexctl serve", OPT_PRIO | OPT_PRIV | OPT_LIMITS, NULL, 60, 1 },
	{ "pipexctl_required", o_bool, &px_required,
	  "Fail when pipexctl cannot provide the channel", OPT_PRIO | OPT_PRIV | 1 },
	{ "pipexctl_compression", o_bool, &px_compression,
	  "Keep ACFC/PFC, VJ and CCP compression on the kernel channel", OPT_PRIO | OPT_PRIV | 1 },
	{ NULL }
};

static struct channel *px_fallback;	/* the channel pppd had (tty) */
static int px_fd = -1;			/* the PPPoL2TP socket */
static int px_tunnel_fd = -1;		/* a copy of the tunnel's UDP socket */
static int px_nokernel;			/* errno of the PPPoL2TP probe at load (0: fine) */

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

/* Ask the daemon for our channel; 0 and px_fd set on success. */
static int px_request(char *why, size_t whylen)
{
	struct sockaddr_un sa;
	char req[128], rep[1024];
	int s, fd = -1, fds[2];
	long sid, tid;
	struct sockaddr_storage addr;
	socklen_t alen = sizeof(addr);
	struct stat st;

	s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0) {
		snprintf(why, whylen, "socket: %s", strerror(errno));
		return -1;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	if (strlen(px_socket) >= sizeof(sa.sun_path)) {
		snprintf(why, whylen, "socket path too long");
		close(s);
		return -1;
	}
	strcpy(sa.sun_path, px_socket);
	if (px_connect_timeout(s, &sa) < 0) {
		snprintf(why, whylen, "cannot reach %s: %s", px_socket, strerror(errno));
		close(s);
		return -1;
	}
	/* the daemon identifies us by SO_PEERCRED; the pid here is informational */
	snprintf(req, sizeof(req), "{\"op\": \"channel\", \"v\": 2, \"pid\": %d}\n", (int)getpid());
	if (px_send(s, req, isatty(0) ? 0 : -1) != (ssize_t)strlen(req)) {
		snprintf(why, whylen, "write to %s: %s", px_socket, strerror(errno));
		close(s);
		return -1;
	}
	if (px_recv(s, rep, sizeof(rep), fds) < 0) {
		snprintf(why, whylen, "no reply from %s: %s", px_socket, strerror(errno));
		close(s);
		return -1;
	}
	fd = fds[0];
	if (fds[1] >= 0 && !px_is_tunnel_socket(fds[1])) {
		snprintf(why, whylen, "second fd of the reply is not a connected UDP socket");
		close(fds[1]);
		if (fd >= 0)
			close(fd);
		close(s);
		return -1;
	}
	/* the contract: the reply is one JSON object whose first member is "ok" */
	if (strncmp(rep, "{\"ok\": true,", 12) != 0) {
		px_refusal(why, whylen, rep);
		if (fd >= 0)
			close(fd);
		if (fds[1] >= 0)
			close(fds[1]);
		close(s);
		return -1;
	}
	/* validate before use: a PPPoX socket bound to the session we were told */
	sid = px_json_int(rep, "session_id");
	tid = px_json_int(rep, "tunnel_id");
	memset(&addr, 0, sizeof(addr));
	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
		snprintf(why, whylen, "reply carried no socket");
	else if (getsockname(fd, (struct sockaddr *)&addr, &alen) < 0 || addr.ss_family != AF_PPPOX)
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
	else
		why[0] = 0;
	/* the daemon undoes the offload unless we acknowledge what we checked */
	if (!why[0] && send(s, "{\"op\": \"ack\"}\n", 14, MSG_NOSIGNAL) != 14)
		snprintf(why, whylen, "cannot acknowledge the channel: %s", strerror(errno));
	close(s);
	if (why[0]) {
		if (fd >= 0)
			close(fd);
		if (fds[1] >= 0)
			close(fds[1]);
		return -1;
	}
	px_fd = fd;
	px_tunnel_fd = fds[1];
	info("pipexctl: kernel channel for tunnel %ld session %ld (peer %ld/%ld)",
	     tid, sid, px_json_int(rep, "peer_tunnel_id"),
	     px_json_int(rep, "peer_session_id"));
	return 0;
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
		px_release_pty();
		px_no_compression();
		return;
	}
	if (px_required)
		fatal("pipexctl: %s (pipexctl_required is set)", why);
	warn("pipexctl: %s; continuing on the pty", why);
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
