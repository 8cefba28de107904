/*
 * noop-plugin: a chained CNI plugin that does nothing, in C — what libcni's handling of
 * one more plugin in a chain costs, with (almost) nothing of the plugin's own.
 * Reads stdin, answers ADD with an empty 1.0.0 result (the conflists of bench/run.sh
 * are 1.0.0), VERSION with its versions, anything else with no output.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    char buf[65536];
    while (read(0, buf, sizeof buf) > 0) {
    }
    const char *cmd = getenv("CNI_COMMAND");
    if (cmd && !strcmp(cmd, "ADD"))
        fputs("{\"cniVersion\":\"1.0.0\",\"dns\":{}}\n", stdout);
    else if (cmd && !strcmp(cmd, "VERSION"))
        fputs("{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.3.0\",\"0.3.1\",\"0.4.0\","
              "\"1.0.0\"]}\n",
              stdout);
    return 0;
}
