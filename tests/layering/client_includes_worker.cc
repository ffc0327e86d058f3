// The client library is below the trainer that uses it.
#include "worker/trainer.h"
