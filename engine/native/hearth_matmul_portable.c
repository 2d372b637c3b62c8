/* hearth.MatMulQ for portable (build.sh's flags for this file say which instructions the compiler may use). */
#define HEARTH_ISA_NAME "portable"
#define HEARTH_ISA_TABLE hearth_matmul_portable
#include "hearth_matmul_impl.h"
