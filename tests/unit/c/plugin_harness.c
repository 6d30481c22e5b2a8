/*
 * Drives the plugin's request path (px_request: connect, send, receive the
 * reply and its fds, check them) outside pppd, for tests/unit/test_plugin_fuzz.py.
 * Built with -fsanitize=address,undefined, against pppd 2.4.9's headers.  For each line on stdin it asks
 * the socket in argv[1] once and prints "<result> <open fds> <bad bytes> <why>": a line "go" asks
 * at pppd's start (px_request), a line "move" as a running call does (px_move).
 * pppd's own symbols the plugin names are stubbed below.
 */
#include "pipexctl.c"

#include <dirent.h>
#include <stdarg.h>

#define PX_STUB(name) \
	void name(char *fmt, ...) { va_list a; va_start(a, fmt); vfprintf(stderr, fmt, a); va_end(a); fputc('\n', stderr); }
PX_STUB(info)
PX_STUB(error)
PX_STUB(warn)
PX_STUB(notice)
PX_STUB(dbglog)
void fatal(char *fmt, ...) { fprintf(stderr, "fatal: %s\n", fmt); exit(3); }
void add_options(option_t *o) { (void)o; }
int generic_establish_ppp(int fd) { (void)fd; return -1; }
void generic_disestablish_ppp(int fd) { (void)fd; }
char ifname[MAXIFNAMELEN];
struct channel *the_channel;
lcp_options lcp_wantoptions[NUM_PPP], lcp_allowoptions[NUM_PPP], lcp_gotoptions[NUM_PPP], lcp_hisoptions[NUM_PPP];
fsm lcp_fsm[NUM_PPP];
void timeout(void (*f)(void *), void *arg, int s, int us) { (void)f; (void)arg; (void)s; (void)us; }
ipcp_options ipcp_wantoptions[NUM_PPP], ipcp_allowoptions[NUM_PPP];
ccp_options ccp_wantoptions[NUM_PPP], ccp_allowoptions[NUM_PPP];

static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = -1;	/* the directory's own fd */

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

int main(int argc, char **argv)
{
	char line[16], why[512];
	int r, bad;

	if (argc != 2 || strlen(argv[1]) >= sizeof(px_socket))
		return 2;
	strcpy(px_socket, argv[1]);
	px_timeout = 2;
	while (fgets(line, sizeof(line), stdin)) {
		why[0] = 0;
		r = strncmp(line, "move", 4) == 0 ? px_move(why, sizeof(why)) : px_request(why, sizeof(why));
		if (r == 0) {
			close(px_fd);
			if (px_tunnel_fd >= 0)
				close(px_tunnel_fd);
			px_fd = px_tunnel_fd = -1;
		}
		/* how many bytes of why are not printable ASCII (the plugin must
		 * let none into pppd's log), then why with those shown as '?' */
		bad = 0;
		for (char *p = why; *p; p++)
			if (*p < 0x20 || *p >= 0x7f) {
				bad++;
				*p = '?';
			}
		printf("%d %d %d %s\n", r, open_fds(), bad, why);
		fflush(stdout);
	}
	return 0;
}
