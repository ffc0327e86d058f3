// The server does not reach into the coordinator: the node wires the two
// (initial window, data progress for checkpoints).
#include "coord/coordinator.h"
