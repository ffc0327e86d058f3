// Control: a component reaches its own headers (so the probes below fail
// for the include they make, not for the way they are built).
#include "table/sparse_table.h"
