/* The SVG writer of the tool's pictures: a header, text with XML escaping, and the end of the
 * document with its write errors reported (tools/svg.h). */
#define _POSIX_C_SOURCE 200809L
#include "svg.h"

#include "cli_args.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void svg_escaped(FILE *f, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '<':
      fputs("&lt;", f);
      break;
    case '>':
      fputs("&gt;", f);
      break;
    case '&':
      fputs("&amp;", f);
      break;
    case '"':
      fputs("&quot;", f);
      break;
    case '\'':
      fputs("&apos;", f);
      break;
    default:
      fputc(*s, f);
    }
  }
}

FILE *svg_begin(const char *path, int width, int height, const char *title) {
  FILE *f = fopen(path, "w");
  if (!f) return NULL;
  fprintf(f,
          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
          "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n<title>",
          width, height, width, height);
  svg_escaped(f, title);
  fprintf(f,
          "</title>\n<rect class=\"background\" x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" "
          "fill=\"white\"/>\n",
          width, height);
  return f;
}

int svg_end(FILE *f, const char *cmd, const char *path) {
  fputs("</svg>\n", f);
  char what[4200];
  snprintf(what, sizeof what, "'%s'", path);
  return cli_finish_output(cmd, f, what);
}

void svg_text(FILE *f, double x, double y, int size, const char *anchor, const char *cls,
              const char *text) {
  fprintf(f, "<text class=\"%s\" x=\"%.1f\" y=\"%.1f\" font-size=\"%d\" text-anchor=\"%s\">", cls,
          x, y, size, anchor);
  svg_escaped(f, text);
  fputs("</text>\n", f);
}
