/* The Pod sandbox's process (containerd's CRI `sandbox_image`): it holds the Pod's namespaces
 * while its containers come and go. As PID 1 of the sandbox it reaps any child handed to it
 * and exits at SIGTERM or SIGINT. Built static by pause.sh, so its image holds one file. */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>

int main(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, NULL);
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0)
            continue;
        if (sig != SIGCHLD)
            return 0;
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
    }
}
