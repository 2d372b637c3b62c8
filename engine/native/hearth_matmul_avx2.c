/* hearth.MatMulQ for avx2 (build.sh's flags for this file say which instructions the compiler may use). */
#define HEARTH_ISA_NAME "avx2"
#define HEARTH_ISA_TABLE hearth_matmul_avx2
#include "hearth_matmul_impl.h"
