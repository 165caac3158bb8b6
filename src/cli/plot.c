/* plot.c - the loss curve of `lmx train`: OUT/loss.png from OUT/metrics.csv, drawn by matplotlib.
 *
 * Why matplotlib: it is the library people read loss curves in (mlx-lm's and HF's training reports
 * use it), it draws proper axes, legends and log scales, and running it as `python3 -c` keeps a
 * plotting library out of the engine's build for one picture.  scripts/setup.sh installs Debian's
 * python3-matplotlib; without it the run only says that no picture was drawn.  The interpreter:
 * $LMX_PYTHON when set, else python3, else /usr/bin/python3 (the first that draws it). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"

static const char plot_script[] =
    "import csv, sys\n"
    "import matplotlib\n"
    "matplotlib.use('Agg')\n"
    "import matplotlib.pyplot as plt\n"
    "rows = list(csv.DictReader(open(sys.argv[1])))\n"
    "step = [int(r['step']) for r in rows]\n"
    "loss = [float(r['loss']) for r in rows]\n"
    "val = [(int(r['step']), float(r['valid_loss'])) for r in rows if r.get('valid_loss')]\n"
    "fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)\n"
    "ax.plot(step, loss, label='training loss', linewidth=1.2)\n"
    "if val:\n"
    "    ax.plot([v[0] for v in val], [v[1] for v in val], 'o-', label='validation loss')\n"
    "ax.set_xlabel('step')\n"
    "ax.set_ylabel('loss')\n"
    "if min(loss + [v[1] for v in val]) > 0: ax.set_yscale('log')\n"
    "ax.grid(True, alpha=0.3)\n"
    "ax.legend()\n"
    "ax.set_title(sys.argv[3])\n"
    "fig.tight_layout()\n"
    "fig.savefig(sys.argv[2])\n";

/* python (a command name or path) -c plot_script csv png title; its exit status (-1: not run) */
static int run_python(const char *python, const char *csv, const char *png, const char *title) {
    const pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        FILE *null = freopen("/dev/null", "w", stderr); /* a missing module is reported by the caller */
        (void)null;
        execlp(python, python, "-c", plot_script, csv, png, title, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int cli_plot_loss(const char *csv, const char *png, const char *title) {
    /* $LMX_PYTHON (the interpreter the mlx_lm backend uses too), python3 on the PATH (perhaps a virtual
     * environment's), then the system's, where apt installs matplotlib */
    const char *env = getenv("LMX_PYTHON");
    if (env && *env && run_python(env, csv, png, title) == 0) return 0;
    return run_python("python3", csv, png, title) == 0 || run_python("/usr/bin/python3", csv, png, title) == 0 ? 0 : 1;
}
