"""compile"""
