/* The shared option parser of the tpflex commands; see cli_args.h. */
#define _POSIX_C_SOURCE 200809L /* readlink */
#include "cli_args.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tpflex/tpflex_cost.h"

#ifndef TPF_COST_REL
#define TPF_COST_REL "../share/tpflex/cost"
#endif
#ifndef TPF_COST_SRC_DIR
#define TPF_COST_SRC_DIR ""
#endif

bool cli_parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *out) {
  if (!text || !text[0]) return false;
  if (text[0] == '0' && text[1]) return false; /* no leading zero: never octal */
  uint64_t v = 0;
  for (const char *p = text; *p; p++) {
    if (*p < '0' || *p > '9') return false;
    unsigned d = (unsigned)(*p - '0');
    if (v > (UINT64_MAX - d) / 10) return false; /* would wrap */
    v = v * 10 + d;
  }
  if (v < min || v > max) return false;
  *out = v;
  return true;
}

void cli_json_escaped(const char *s) {
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      printf("\\%c", ch);
    else if (ch < 0x20)
      printf("\\u%04x", ch);
    else
      putchar(ch);
  }
}

int cli_error(const cli_ctx *ctx, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (ctx->json) {
    printf("{\"status\":\"error\",\"exit\":2,\"message\":\"");
    cli_json_escaped(ctx->cmd);
    printf(": ");
    cli_json_escaped(msg);
    printf("\"}\n");
    fflush(stdout);
  } else {
    fprintf(stderr, "%s: %s\n", ctx->cmd, msg);
  }
  return 2;
}

int cli_find(const cli_opt *opts, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(opts[i].name, name) == 0) return i;
  return -1;
}

bool cli_has_word(int argc, char **argv, const char *w) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], w) == 0) return true;
  return false;
}

/* Index of word in the '|'-separated list, or -1. */
static int choice_index(const char *choices, const char *word) {
  size_t wl = strlen(word);
  int idx = 0;
  for (const char *p = choices;; idx++) {
    const char *bar = strchr(p, '|');
    size_t l = bar ? (size_t)(bar - p) : strlen(p);
    if (l == wl && wl > 0 && strncmp(p, word, l) == 0) return idx;
    if (!bar) return -1;
    p = bar + 1;
  }
}

void cli_usage(FILE *f, const cli_opt *opts, int n, const char *usage_intro, const char *outro) {
  fprintf(f, "%s\n", usage_intro);
  for (int i = 0; i < n; i++) {
    const cli_opt *o = &opts[i];
    char left[96];
    if (o->kind == CLI_FLAG)
      snprintf(left, sizeof left, "%s", o->name);
    else if (o->kind == CLI_CHOICE)
      snprintf(left, sizeof left, "%s %s", o->name, o->choices);
    else
      snprintf(left, sizeof left, "%s %s", o->name, o->metavar ? o->metavar : "N");
    if (o->kind == CLI_U64)
      fprintf(f, "  %-28s %s [%llu..%llu]\n", left, o->help, (unsigned long long)o->min,
              (unsigned long long)o->max);
    else
      fprintf(f, "  %-28s %s\n", left, o->help);
  }
  fprintf(f, "  %-28s %s\n", "--help, -h", "this text");
  if (outro) fprintf(f, "%s", outro);
}

int cli_parse(const cli_ctx *ctx, const cli_opt *opts, int n, int argc, char **argv, cli_val *vals,
              const char *usage_intro) {
  memset(vals, 0, (size_t)n * sizeof *vals);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      cli_usage(stdout, opts, n, usage_intro, NULL); /* asked for, even with --json */
      return 0;
    }
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strncmp(a, "--", 2) != 0 || !a[2])
      return cli_error(ctx, "unexpected argument '%s' (options start with --; see --help)", a);
    char name[64];
    const char *eq = strchr(a, '=');
    const char *v = NULL;
    size_t nl = eq ? (size_t)(eq - a) : strlen(a);
    if (nl >= sizeof name) return cli_error(ctx, "unknown option '%s'", a);
    memcpy(name, a, nl);
    name[nl] = '\0';
    int k = cli_find(opts, n, name);
    if (k < 0) return cli_error(ctx, "unknown option '%s' (see --help)", name);
    const cli_opt *o = &opts[k];
    if (vals[k].set && !o->repeat) return cli_error(ctx, "%s given more than once", name);
    if (o->kind == CLI_FLAG) {
      if (eq) return cli_error(ctx, "%s takes no value (got '%s')", name, a);
      vals[k].set = true;
      continue;
    }
    if (eq) {
      v = eq + 1;
    } else {
      if (i + 1 >= argc) return cli_error(ctx, "%s needs a value", name);
      /* "--trace --no-check" would otherwise write a file called "--no-check" and run with the
       * checks on: the next word is an option, so the value is missing. */
      if (strncmp(argv[i + 1], "--", 2) == 0)
        return cli_error(ctx,
                         "%s needs a value (the next word '%s' is an option; write %s=VALUE "
                         "for a value that starts with --)",
                         name, argv[i + 1], name);
      v = argv[++i];
    }
    switch (o->kind) {
    case CLI_U64: {
      uint64_t x = 0;
      if (!cli_parse_u64(v, o->min, o->max, &x))
        return cli_error(ctx, "%s '%s' is not a decimal number in [%llu, %llu]", name, v,
                         (unsigned long long)o->min, (unsigned long long)o->max);
      vals[k].u = x;
      break;
    }
    case CLI_CHOICE: {
      int c = choice_index(o->choices, v);
      if (c < 0) return cli_error(ctx, "%s '%s' is not one of %s", name, v, o->choices);
      vals[k].u = o->repeat ? (vals[k].u | ((uint64_t)1 << c)) : (uint64_t)c;
      break;
    }
    default: /* CLI_STR */
      if (!v[0]) return cli_error(ctx, "%s '' is empty", name);
      break;
    }
    vals[k].set = true;
    vals[k].s = v;
  }
  return -1;
}

char *cli_read_text(const char *path, size_t max) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  char *buf = malloc(max + 1);
  size_t n = buf ? fread(buf, 1, max, f) : 0;
  int more = buf ? fgetc(f) : EOF;
  fclose(f);
  if (!buf || more != EOF) {
    free(buf);
    return NULL;
  }
  buf[n] = '\0';
  return buf;
}

int cli_load_cost(const cli_ctx *ctx, const char *opt, const char *path, const char *default_name,
                  struct tpf_cost_table *out, char *used, size_t len) {
  char *text = NULL;
  if (path) {
    text = cli_read_text(path, 1u << 20);
    if (!text) return cli_error(ctx, "%s '%s' cannot be read (or is over 1 MiB)", opt, path);
    snprintf(used, len, "%s", path);
  } else {
    /* The installed layout first: the directory of this executable (/proc/self/exe, so the
     * prefix the files were installed under, not the one compiled in), then TPF_COST_REL
     * ("../share/tpflex/cost"); then the source tree's data/cost (a binary in its build folder). */
    char dirs[2][4096] = {"", TPF_COST_SRC_DIR};
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
      exe[n] = '\0';
      char *slash = strrchr(exe, '/');
      if (slash) *slash = '\0';
      snprintf(dirs[0], sizeof dirs[0], "%.3000s/%s", exe, TPF_COST_REL);
    }
    for (int i = 0; i < 2 && !text; i++) {
      if (!dirs[i][0]) continue;
      snprintf(used, len, "%s/%s", dirs[i], default_name);
      text = cli_read_text(used, 1u << 20);
    }
    if (!text)
      return cli_error(ctx,
                       "no default cost table %s found (looked in '%s' and '%s'); pass %s FILE",
                       default_name, dirs[0][0] ? dirs[0] : "(no /proc/self/exe)",
                       dirs[1][0] ? dirs[1] : "(no source tree)", opt);
  }
  tpf_status rc = tpf_cost_table_parse(text, out);
  free(text);
  if (rc != TPF_OK) return cli_error(ctx, "%s '%s': %s", opt, used, tpf_last_error());
  return -1;
}

int cli_finish_output(const char *cmd, FILE *f, const char *what) {
  /* ferror first: a write that failed earlier may have dropped its bytes, after which the final
   * flush and close can succeed. errno of that failure is gone by now, so the flush's or the
   * close's is named when they fail too, else the error is called an earlier one. */
  const bool earlier = ferror(f) != 0;
  int err = 0;
  if (fflush(f) != 0) err = errno ? errno : EIO;
  if (f != stdout && f != stderr && fclose(f) != 0 && !err) err = errno ? errno : EIO;
  if (!earlier && !err) return 0;
  fprintf(stderr, "%s: writing %s failed: %s\n", cmd, what,
          err ? strerror(err) : "an earlier write to it failed");
  return 1;
}

bool cli_path_writable(const char *path) {
  struct stat sb;
  if (stat(path, &sb) == 0) {
    if (S_ISDIR(sb.st_mode)) {
      errno = EISDIR;
      return false;
    }
    return access(path, W_OK) == 0;
  }
  if (errno != ENOENT) return false;
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash)
    snprintf(dir, sizeof dir, ".");
  else if (slash == path)
    snprintf(dir, sizeof dir, "/");
  else
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  return access(dir, W_OK | X_OK) == 0;
}
