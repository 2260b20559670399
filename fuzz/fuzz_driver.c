/* The replay engine (zstd's regression_driver.c): a plain main() that feeds every file named on
 * the command line, and every regular file inside every directory named there (sorted, not
 * recursive), to LLVMFuzzerTestOneInput once. CTest runs it over fuzz/corpus/<target>/ in every
 * build (label fuzz-regress), so gcc builds, sanitizer builds and coverage all replay the seeds.
 * An invariant violation aborts, which CTest reports as a failure. The empty input is always
 * replayed first. Exit status: 0 when everything ran, 1 when an argument could not be read or a
 * directory held no inputs. */
#define _POSIX_C_SOURCE 200809L /* opendir, stat under -std=c11 */

#include "fuzz_input.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "fuzz_driver: cannot open %s: %s\n", path, strerror(errno));
    return -1;
  }
  size_t cap = 4096, n = 0;
  uint8_t *buf = malloc(cap);
  if (!buf) {
    fclose(f);
    return -1;
  }
  for (;;) {
    if (n == cap) {
      uint8_t *grown = realloc(buf, cap * 2);
      if (!grown) {
        free(buf);
        fclose(f);
        return -1;
      }
      buf = grown;
      cap *= 2;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (got == 0) break;
  }
  int err = ferror(f);
  fclose(f);
  if (err) {
    fprintf(stderr, "fuzz_driver: cannot read %s\n", path);
    free(buf);
    return -1;
  }
  /* Exact-size copy, so ASan catches a harness reading past the input. */
  uint8_t *exact = malloc(n ? n : 1);
  if (!exact) {
    free(buf);
    return -1;
  }
  memcpy(exact, buf, n);
  free(buf);
  LLVMFuzzerTestOneInput(exact, n);
  free(exact);
  return 0;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replays the regular files of a directory in name order; returns the count or -1. */
static long run_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "fuzz_driver: cannot open directory %s: %s\n", dir, strerror(errno));
    return -1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      char **grown = realloc(names, cap * sizeof *names);
      if (!grown) break;
      names = grown;
    }
    size_t len = strlen(dir) + strlen(e->d_name) + 2;
    names[n] = malloc(len);
    if (!names[n]) break;
    snprintf(names[n], len, "%s/%s", dir, e->d_name);
    n++;
  }
  closedir(d);
  if (n > 0) qsort(names, n, sizeof *names, cmp_names);
  long ran = 0;
  for (size_t i = 0; i < n; i++) {
    struct stat st;
    if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
      if (run_file(names[i]) != 0)
        ran = -1;
      else if (ran >= 0)
        ran++;
    }
    free(names[i]);
  }
  free(names);
  return ran;
}

int main(int argc, char **argv) {
  long total = 0;
  int rc = 0;
  LLVMFuzzerTestOneInput((const uint8_t *)"", 0);
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "fuzz_driver: %s: %s\n", argv[i], strerror(errno));
      rc = 1;
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      long n = run_dir(argv[i]);
      if (n <= 0) {
        fprintf(stderr, "fuzz_driver: %s: %s\n", argv[i], n == 0 ? "no inputs" : "read error");
        rc = 1;
      } else {
        total += n;
      }
    } else if (run_file(argv[i]) != 0) {
      rc = 1;
    } else {
      total++;
    }
  }
  printf("fuzz_driver: %s: %ld inputs replayed%s\n", argc > 0 ? argv[0] : "?", total,
         rc ? " (with errors)" : ", all invariants held");
  return rc;
}
