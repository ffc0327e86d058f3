// Tables know nothing of the server that holds them.
#include "server/ps_server.h"
