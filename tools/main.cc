// fp8ref — the command line: subcommand dispatch, --help, --version, exit codes.
//   0 success · 1 numerical failure (diff, validate) · 2 bad usage or bad input
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "cli.h"
#include "fp8ref/error.h"

namespace {

using fp8ref::cli::Command;

#define FP8REF_TABLE_ENTRY(name) &fp8ref::cli::kCmd_##name,
const Command* const kCommands[] = {FP8REF_COMMANDS(FP8REF_TABLE_ENTRY)};
#undef FP8REF_TABLE_ENTRY

const Command* find_command(const char* name) {
  for (const Command* c : kCommands)
    if (std::strcmp(c->name, name) == 0) return c;
  return nullptr;
}

void print_program_help(std::FILE* out) {
  std::fprintf(out,
               "fp8ref %s — bit-exact CPU reference for FP8 LLM kernels\n"
               "\n"
               "Usage: fp8ref <command> [options] [arguments]\n"
               "       fp8ref <command> --help\n"
               "       fp8ref --version\n"
               "\n"
               "Commands:\n",
               fp8ref::cli::kVersion);
  for (const Command* c : kCommands) std::fprintf(out, "  %-12s %s\n", c->name, c->summary);
  std::fprintf(out,
               "\n"
               "Exit codes: 0 success, 1 numerical failure, 2 bad usage or bad input.\n"
               "Run 'fp8ref <command> --help' for a command's options.\n");
}

bool is_help(const char* a) { return std::strcmp(a, "--help") == 0 || std::strcmp(a, "-h") == 0; }

int run_command(const Command& cmd, int argc, char** argv) {
  // --help anywhere before "--" prints the command's help, whatever else is on the line.
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    if (is_help(argv[i])) {
      std::fputs(cmd.help, stdout);
      return 0;
    }
  }
  try {
    return cmd.main(argc, argv);
  } catch (const fp8ref::cli::UsageError& e) {
    std::fprintf(stderr, "fp8ref %s: error: %s (see 'fp8ref %s --help')\n", cmd.name, e.what(), cmd.name);
  } catch (const fp8ref::InputError& e) {
    std::fprintf(stderr, "fp8ref %s: error: %s\n", cmd.name, e.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "fp8ref %s: error: out of memory\n", cmd.name);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8ref %s: error: %s\n", cmd.name, e.what());
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_program_help(stderr);
    return 2;
  }
  const char* first = argv[1];
  if (is_help(first)) {
    print_program_help(stdout);
    return 0;
  }
  if (std::strcmp(first, "--version") == 0 || std::strcmp(first, "-V") == 0) {
    std::printf("fp8ref %s\n", fp8ref::cli::kVersion);
    return 0;
  }
  if (std::strcmp(first, "help") == 0) {  // fp8ref help [COMMAND]
    if (argc == 2) {
      print_program_help(stdout);
      return 0;
    }
    if (const Command* c = find_command(argv[2])) {
      std::fputs(c->help, stdout);
      return 0;
    }
    std::fprintf(stderr, "fp8ref: error: unknown command '%s' (see 'fp8ref --help')\n", argv[2]);
    return 2;
  }
  const Command* cmd = find_command(first);
  if (!cmd) {
    if (first[0] == '-')
      std::fprintf(stderr, "fp8ref: error: unknown option '%s' (see 'fp8ref --help')\n", first);
    else
      std::fprintf(stderr, "fp8ref: error: unknown command '%s' (see 'fp8ref --help')\n", first);
    return 2;
  }
  return run_command(*cmd, argc - 1, argv + 1);
}
