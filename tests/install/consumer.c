/* A program outside the tree that finds tpflex through find_package and pkg-config. */
#include <stdio.h>
#include <tpflex/tpflex.h>

int main(void) {
  tpf_layout_desc d = {.tp_size = 4,
                       .rank = 1,
                       .algo = TPF_ALGO_RING,
                       .coll = TPF_COLL_AG,
                       .dtype = TPF_BF16,
                       .capacity = {4096, 1024},
                       .active = {1000, 1024}};
  uint64_t bytes = 0;
  tpf_status s = tpf_layout_active_bytes(&d, &bytes);
  printf("installed tpflex: %s, active bytes %llu\n", tpf_status_name(s),
         (unsigned long long)bytes);
  return s == TPF_OK && bytes == 1000ull * 1024 * 2 ? 0 : 1;
}
