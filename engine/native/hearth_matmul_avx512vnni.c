/* hearth.MatMulQ for avx512vnni (build.sh's flags for this file say which instructions the compiler may use). */
#define HEARTH_ISA_NAME "avx512vnni"
#define HEARTH_ISA_TABLE hearth_matmul_avx512vnni
#include "hearth_matmul_impl.h"
