/* hearth.MatMulQ for avx512 (build.sh's flags for this file say which instructions the compiler may use). */
#define HEARTH_ISA_NAME "avx512"
#define HEARTH_ISA_TABLE hearth_matmul_avx512
#include "hearth_matmul_impl.h"
