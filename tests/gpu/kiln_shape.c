/* kiln-shape: `kilnd shape` (kilnd/shape.c) on its own, linked with core/ alone, so the
 * GPU machine, which builds without the network dependencies, makes the real-shape
 * models it measures instead of receiving them (tests/gpu/run.sh's SHAPES). */
#include "kilnd/kilnd.h"

int main(int argc, char **argv) { return kd_shape(argc, argv); }
