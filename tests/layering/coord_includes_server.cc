// The coordinator talks to servers over the wire only.
#include "server/ps_server.h"
