/* Carries the raw Go build id string that old Go linkers put at the start
 * of the text, so the fallback reader can be tested without an old Go. */
__attribute__((used)) static const char go_build_id[] =
	"\xff Go build ID: \"abcdefghij/klmnopqrst\"\n \xff";
int main(void) { return 0; }
