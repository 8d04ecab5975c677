/* The executable of TestForgedRuby: runs forged.c's forgery (linked as
 * libruby-3.1.so.3.1.99) in the mode argv[1] says. */
int forge_run(const char *mode);

int main(int argc, char **argv)
{
	return forge_run(argc > 1 ? argv[1] : "wild");
}
