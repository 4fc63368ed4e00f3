// moetrain command line: subcommands train, data, inspect.
#include <cstdio>

int main() {
    return 0;
}
